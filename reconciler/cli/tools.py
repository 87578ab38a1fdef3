"""Commands about the tool itself rather than a host: ``reconciler schema KIND`` and ``reconciler completion SHELL``.

Registered by ``reconciler.cli.build_parser``; each imports what it needs when it runs (shtab; the schemas are built
from the model by ``reconciler.load.file_schema.render`` only when asked), so no other command pays for them. Neither reads ``--root``.
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.cli.common import EXIT_OK
from reconciler.load.file_schema import KINDS, render

SHELLS = ("bash", "zsh")


def cmd_schema(args: argparse.Namespace) -> int:
    print(render(args.kind), end="")
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab  # the optional SDK: shtab, for this command alone

    parser: argparse.ArgumentParser = args.parser
    _mark_paths(parser, shtab)
    print(shtab.complete(parser, shell=args.shell), end="")
    return EXIT_OK


def _mark_paths(parser: argparse.ArgumentParser, shtab: Any) -> None:
    """Complete --root with directories and every FILE argument with files (shtab reads ``action.complete``)."""
    for action in parser._actions:
        if "--root" in action.option_strings:
            action.complete = shtab.DIRECTORY  # type: ignore[attr-defined]
        elif action.metavar in ("FILE", "PLAN_FILE"):
            action.complete = shtab.FILE  # type: ignore[attr-defined]
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _mark_paths(sub, shtab)


def add_commands(sub: Any, *, root: argparse.ArgumentParser) -> None:
    """Add ``schema`` and ``completion`` to the top-level subcommands; ``root`` is the parser completion describes."""
    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of a kind of file (host, recipe, manifest), for editors and clients",
        description="Print the JSON Schema (draft 2020-12) of configs/host.yaml (host), configs/recipes/NAME.toml "
        "(recipe) or manifests/NAME.yaml (manifest), generated from the model; schemas/ in the repository holds the "
        "same.",
    )
    p.add_argument("kind", choices=list(KINDS), help="which kind of file")
    p.set_defaults(func=cmd_schema)
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh)",
        description="Print a completion script generated from this command line. bash: "
        "`source <(reconciler completion bash)`, or save it in /etc/bash_completion.d/reconciler; zsh: save it as "
        "_reconciler in a directory of $fpath.",
    )
    p.add_argument("shell", choices=SHELLS, help="which shell")
    p.set_defaults(func=cmd_completion, parser=root)
