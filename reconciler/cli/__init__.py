"""The command line: ``reconciler validate | plan | apply | run | status | shm``.

This file is the package's facade: the entry point of the console script (``main``) and the parser that registers
every command (``build_parser``; the commands of ``apply``, ``run``, ``shm``, ``tools`` and the others are registered
by those modules); each command's handler is in ``reconciler.cli.commands``, imported when it runs. Every command takes ``--root`` and ``--json`` (before or after the command name). Exit
codes are part of the contract (docs/design.md, "The command line"): plan 0 nothing to do, 2 changes pending, 3
blocked, 4 held, 1 error; ``status --check`` 0 as wanted, 2 converging, 3 blocked, 4 held, 1 error. While ``reconciler run`` runs for the host, the commands in ``LOOP_COMMANDS`` are answered by it
(``reconciler.control.client``): ``main`` hands them over before importing anything of the model, and the loop runs
them through ``run_command`` as this process would (``reconciler.cli.front_ends``).
"""

from __future__ import annotations

import argparse
import os
import sys

from reconciler import __version__
from reconciler.cli.apply import add_commands as add_apply
from reconciler.cli.common import LOOP_COMMANDS, Command, command_name, default_root, run_command
from reconciler.cli.fleet import add_commands as add_fleet
from reconciler.cli.install import add_commands as add_install
from reconciler.cli.qualify import add_commands as add_qualify
from reconciler.cli.run import add_commands as add_run
from reconciler.cli.shm import add_commands as add_shm
from reconciler.cli.tools import add_commands as add_tools

# Nothing heavy is imported at module level: `reconciler --help` and a mistyped command pay for argparse only,
# and each command's handler (``reconciler.cli.commands``, named by a ``Command``) imports what it needs (pydantic,
# the engine client, NVML) when it runs.


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: the value given before the command name stays unless repeated after it.
    common.add_argument(
        "--root",
        default=argparse.SUPPRESS,
        help="directory holding configs/ and manifests/ (default: $RECONCILER_ROOT or .)",
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    # `mcp` speaks JSON-RPC on stdio whatever is asked: it takes --root alone.
    root_only = argparse.ArgumentParser(add_help=False)
    root_only.add_argument("--root", default=argparse.SUPPRESS, help=common._actions[0].help)

    parser = argparse.ArgumentParser(
        prog="reconciler",
        description="Make a GPU serving host match its manifest: recipes on GPU slots, guarded offload shm.",
    )
    parser.add_argument(
        "--root", default=None, help="directory holding configs/ and manifests/ (default: $RECONCILER_ROOT or .)"
    )
    parser.add_argument("--json", action="store_true", default=False, help="machine-readable output")
    parser.add_argument("--version", action="version", version=f"reconciler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("validate", parents=[common], help="check host, recipes and manifests (0 valid, 1 invalid)")
    p.set_defaults(func=Command("validate", "cmd_validate"))
    p = sub.add_parser(
        "plan",
        parents=[common],
        help="dry run: what would change and why (0 none, 2 pending, 3 blocked, 4 held, 1 error)",
        description="Dry run: what would change and why. Exit 0 nothing to do (the host as wanted), 2 changes "
        "pending, 3 blocked, 4 held (nothing to do now: a wanted lane waits in backoff, a fallback may serve its "
        "slots), 1 error.",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="also save the plan, with a fingerprint of what it was made from, for `reconciler apply FILE`",
    )
    p.set_defaults(func=Command("views", "cmd_plan"))
    p = sub.add_parser(
        "status",
        parents=[common],
        help="what is on each GPU slot, containers, shm, converged or not (0; with --check: the verdict)",
        description="What is on each GPU slot, the containers, the tmpfs, converged or not. Exit 0, 1 if a source "
        "is unavailable or the files are invalid; with --check the exit code is the verdict, for scripts.",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit with the verdict: 0 as wanted, 2 converging (changes pending), 3 blocked, 4 held in backoff, "
        "1 a source unavailable or the files invalid",
    )
    p.set_defaults(func=Command("views", "cmd_status"))
    p = sub.add_parser("audit", parents=[common], help="the audit trail: every action by every front-end and the loop")
    p.add_argument(
        "--since", metavar="WHEN", help="only records since: an age (15m, 2h, 7d), an ISO time or epoch seconds"
    )
    p.set_defaults(func=Command("views", "cmd_audit"))
    p = sub.add_parser(
        "mcp",
        parents=[root_only],
        help="MCP server over stdio (host_status, host_plan, "
        "host_shared_memory, host_probe, host_manage) until its client closes it",
    )
    p.set_defaults(func=Command("mcp", "cmd_mcp"))
    p = sub.add_parser(
        "door",
        parents=[root_only],
        help="the front door: one OpenAI endpoint for the host, routed by model and alias, held through switches",
        description="Serve host.yaml's door.listen (loopback by default): each OpenAI request goes to the lane that "
        "serves its model or alias, held while that lane enters, wakes or is about to leave (door.hold_s), streamed "
        "back as it comes. Off loopback it needs its own token (door-token in the state directory, or --token-file).",
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="listen here instead of host.yaml's door.listen")
    p.add_argument("--token-file", metavar="FILE", help="the door's own token (needed off loopback)")
    p.set_defaults(func=Command("door", "cmd_door"))

    add_apply(sub, parents=[common])
    add_qualify(sub, parents=[common])
    add_run(sub, parents=[common], command_parser=build_parser)
    add_shm(sub, parents=[common])
    add_tools(sub, root=parser)
    add_install(sub, parents=[common])
    add_fleet(sub, parents=[common])
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's ``--help`` opens with the line the command list shows for it, where it has no longer
    description of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    sub.description = helps[name]
                _describe(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.root is None:
        args.root = default_root()
    # The start-up budget: pydantic looks for plugins among every installed distribution's entry points at the
    # first model it builds (a scan of each dist-info); the tool uses none. An operator's own setting is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if command_name(args) in LOOP_COMMANDS:
        # The start-up budget: `--help` and a command the loop does not answer never load the socket's client.
        from reconciler.control.client import submit

        answered = submit(args, argv)
        if answered is not None:
            return answered
    return run_command(args)


if __name__ == "__main__":
    raise SystemExit(main())
