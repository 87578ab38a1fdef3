"""``reconciler shm status`` and ``reconciler shm reclaim [--confirm]``: the shared-memory guard on the command line.

``add_commands(sub, parents=...)`` is called by ``reconciler.cli.build_parser``; ``parents`` carry ``--root``
and ``--json``; the handlers are ``reconciler.cli.commands.shm``'s, loaded when one of them runs. Exit codes
(docs/design.md, "The command line"): ``shm status`` 0, or 1 when an ownership source is unavailable; ``shm reclaim`` 0
when done or nothing to do, 1 when refused or failed.
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.cli.common import Command


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``shm status`` and ``shm reclaim`` to the top-level subcommands."""
    shm = sub.add_parser("shm", help="offload files in shm.dir: who holds them, guarded cleanup of orphans")
    shm_sub = shm.add_subparsers(dest="shm_command", metavar="SHM_COMMAND")
    shm_sub.required = True
    p = shm_sub.add_parser(
        "status",
        parents=parents,
        help="read-only: every offload file, its owners and state (0, or 1 if a source is unavailable)",
    )
    p.set_defaults(func=Command("shm", "cmd_shm_status"))
    p = shm_sub.add_parser(
        "reclaim",
        parents=parents,
        help="remove orphan offload files: a dry run unless --confirm (0 done or nothing to do, 1 refused/failed)",
    )
    p.add_argument(
        "--confirm",
        action="store_true",
        help="really remove: two inspections shm.confirm_interval_s apart must agree on each file first",
    )
    p.add_argument(
        "--path",
        action="append",
        dest="paths",
        metavar="PATH",
        default=None,
        help="remove only this path (repeatable): the files a dry run listed; anything else is kept",
    )
    p.set_defaults(func=Command("shm", "cmd_shm_reclaim"))
