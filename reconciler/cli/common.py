"""What every command-line module shares: exit codes, the console a command writes to, the redacting JSON writer,
the service for a command.

Imported by ``reconciler.cli`` (the parser and the read-only commands), ``reconciler.cli.apply``,
``reconciler.cli.shm`` and ``reconciler.control`` (which runs the same commands inside a running loop for a client);
it imports none of them, so the command-line modules never import each other.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO, cast

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from reconciler.service import HostService
    from reconciler.service.render import Style

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_BLOCKED = 3


def default_root() -> str:
    """``--root`` when not given: ``$RECONCILER_ROOT``, else the working directory."""
    return os.environ.get("RECONCILER_ROOT") or os.getcwd()


class Terminal:
    """The one boundary of text a command prints: every write is redacted (``reconciler.base.redact.redact_output``: URL
    passwords, the secret values this process learned) and its control characters are shown escaped
    (``reconciler.base.units.terminal_text``: a file name or a container's log line with ESC or U+009B cannot drive the
    terminal), the tool's own colour and redraw sequences kept. JSON goes out through ``write_json`` as it is: it
    was redacted whole by ``redact_json``, and JSON escapes every control character itself."""

    __slots__ = ("stream",)

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        from reconciler.base.redact import redact_output
        from reconciler.base.units import terminal_text

        self.stream.write(terminal_text(redact_output(text)))
        return len(text)

    def write_json(self, text: str) -> int:
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def terminal(stream: TextIO) -> TextIO:
    """``stream`` behind the terminal boundary (once: a stream already behind it is returned as it is)."""
    return stream if isinstance(stream, Terminal) else cast("TextIO", Terminal(stream))


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
        from reconciler.service.render import Style

        stream = stream or self.out
        return Style(stream, color=stream.isatty() and not self.no_color)


def console(args: argparse.Namespace) -> Console:
    """The console of this command: the one the loop gave it, else this process's own."""
    con = getattr(args, "console", None)
    if con is None:
        con = args.console = Console.own()
    return con


def emit_json(data: Any, out: TextIO | None = None) -> None:
    from reconciler.base.redact import redact_json

    # A last pass over every string on its way out: a command line missed at its source is masked here.
    out = out or sys.stdout
    getattr(out, "write_json", out.write)(redact_json(data, indent=2, sort_keys=False, default=str) + "\n")


def service(args: argparse.Namespace) -> HostService:
    """The service for this command. Inside a running loop (``reconciler.control``) it carries the loop's pass
    lock and action hooks, like the loop's HTTP API: destructive calls then wait for a pass to end rather than
    meeting the host lock the loop holds."""
    from reconciler.service import HostService, user_caller

    # The user: the peer's on the loop's socket (its SO_PEERCRED uid, and the SUDO_USER it came with), else ours.
    peer = getattr(args, "peer", None) or {"uid": os.getuid(), "sudo_user": os.environ.get("SUDO_USER") or ""}
    caller = user_caller("cli", uid=peer["uid"], sudo_user=peer["sudo_user"])
    return HostService(args.root, caller=caller, **getattr(args, "serve", {}))
