"""What every command-line module shares: exit codes, the console a command writes to (behind the terminal
boundary of ``reconciler.base.terminal``), the service for a command, and how a command is run and the errors that
end it are printed (``run_command``, ``report_error``).

Imported by ``reconciler.cli`` (the parser), the modules that register commands beside it (``apply``, ``shm``,
``tools``, ``run``, ...; each command's handler is named by a ``Command`` and imported when it runs), the handlers
(``reconciler.cli.commands``) and ``reconciler.cli.front_ends`` (whose runner gives a command the loop answers for a
client its console); it imports none of them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, TextIO

from reconciler.base.terminal import emit_json, print_error, terminal
from reconciler.cli.style import Style

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from reconciler.base.errors import ConfigError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_BLOCKED = 3
EXIT_HELD = 4  # plan, status --check: nothing to do now, a wanted lane waits in backoff


def default_root() -> str:
    """``--root`` when not given: ``$RECONCILER_ROOT``, else the working directory."""
    return os.environ.get("RECONCILER_ROOT") or os.getcwd()


class Console:
    """Where a command writes and what it writes to. A command run by its own process writes to that process's
    streams (``Console.own``); one that a running loop answers for a client (``reconciler.control``) writes to
    streams that carry its output to the client, each reporting the client's own terminal (``isatty``), asks its
    questions there, and is cancelled by the client's Ctrl-C. Everything a command prints goes through here, so
    both ways print the same bytes.

    ``local``: the command runs in its own process's main thread and takes SIGINT/SIGTERM itself (apply's safe
    stop). ``cancel``: set when the client asks to stop (Ctrl-C, the client gone, the loop stopping)."""

    # A plain class, not a dataclass: the dataclasses module (with inspect and ast) is 7 ms of a command that a
    # running loop answers, whose client imports nothing else of the kind.
    __slots__ = ("ask", "cancel", "err", "local", "no_color", "out", "stdin_tty")

    def __init__(
        self,
        out: TextIO,
        err: TextIO,
        *,
        stdin_tty: bool,
        no_color: bool,
        ask: Callable[[str], str],
        local: bool = True,
        cancel: threading.Event | None = None,
    ):
        self.out = terminal(out)  # everything printed passes the one boundary (``Terminal``)
        self.err = terminal(err)
        self.stdin_tty = stdin_tty
        self.no_color = no_color
        self.ask = ask
        self.local = local
        self.cancel = cancel

    @classmethod
    def own(cls) -> Console:
        return cls(
            sys.stdout, sys.stderr, stdin_tty=sys.stdin.isatty(), no_color=bool(os.environ.get("NO_COLOR")), ask=input
        )

    def style(self, stream: TextIO | None = None) -> Style:
        """Colour only on a terminal and without NO_COLOR (the client's, when the loop answers)."""
        stream = stream or self.out
        return Style(stream, color=stream.isatty() and not self.no_color)


def console(args: argparse.Namespace) -> Console:
    """The console of this command: the one the loop gave it, else this process's own."""
    con = getattr(args, "console", None)
    if con is None:
        con = args.console = Console.own()
    return con


class Command:
    """A command's handler, named by its module under ``reconciler.cli.commands`` and its function, and imported when
    the command runs: building the parser (``--help``, a command the loop answers for a client) loads no handler's
    module, and a command loads its own, with what that module imports at its top (the start-up budget)."""

    __slots__ = ("function", "module")

    def __init__(self, module: str, function: str):
        self.module = f"reconciler.cli.commands.{module}"
        self.function = function

    def handler(self) -> Callable[[argparse.Namespace], int]:
        return getattr(importlib.import_module(self.module), self.function)

    def __call__(self, args: argparse.Namespace) -> int:
        return int(self.handler()(args))

    def __repr__(self) -> str:
        return f"Command({self.module}.{self.function})"


# What a running loop answers (``reconciler.control.server``): every command that reads or changes the host through the
# service layer. ``validate``, ``schema`` and ``completion`` read files only; ``run`` and ``mcp`` are servers.
LOOP_COMMANDS = frozenset(
    {"plan", "status", "audit", "probe", "apply", "adopt", "switch", "promote", "sync", "shm status", "shm reclaim"}
)


def command_name(args: argparse.Namespace) -> str:
    """``plan``, ``shm status``, ...: the command with its subcommand."""
    sub = getattr(args, "shm_command", None)
    return f"{args.command} {sub}" if sub else str(args.command)


def report_config_error(exc: ConfigError, args: argparse.Namespace) -> int:
    con = console(args)
    for p in exc.problems:
        print(str(p), file=con.err)
    if getattr(args, "json", False):
        problems = [{"path": p.path, "line": p.line, "message": p.message} for p in exc.problems]
        err = {"code": "config_invalid", "message": "the files do not validate", "problems": problems}
        emit_json(
            {"valid": False, "errors": problems, "error": err} if args.command == "validate" else {"error": err},
            con.out,
        )
    return EXIT_ERROR


def error_code(exc: BaseException) -> str:
    """The stable word for an error's kind: the ``code`` its class states (``LockHeld.code == "lock_held"``);
    ``error`` for anything else."""
    code = getattr(type(exc), "code", None)
    return code if isinstance(code, str) else "error"


def report_error(args: argparse.Namespace, code: str, message: str) -> None:
    """An error that ends a command: on stderr, and with ``--json`` also as ``{"error": {"code", "message"}}`` on
    stdout, so a program reading stdout always gets a JSON answer that says what went wrong."""
    con = console(args)
    print_error(code, message, out=con.out, err=con.err, as_json=bool(getattr(args, "json", False)))


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; its errors printed as the command line prints them, with their exit code. Called by
    ``reconciler.cli.main`` and, for a client, by the running loop (``reconciler.cli.front_ends.CommandRunner``)."""
    # The start-up budget: `--help` never loads the error classes (their NamedTuple costs 1.5 ms).
    from reconciler.base.errors import ConfigError, ReconcilerError

    try:
        return int(args.func(args))
    except ConfigError as exc:
        return report_config_error(exc, args)
    except ReconcilerError as exc:
        report_error(args, error_code(exc), str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        report_error(args, "interrupted", "interrupted")
        return 130
