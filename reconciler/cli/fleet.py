"""``reconciler fleet status --fleet FILE [--json] [--timeout S]``: every host of a fleet file side by side, each read
through its own loop's API. Registered by ``reconciler.cli.build_parser``; the handler is
``reconciler.cli.commands.fleet``'s, loaded when the command runs (the start-up budget of every other command)."""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.cli.common import Command


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    fleet = sub.add_parser("fleet", help="many hosts: each one's verdict, slots, VRAM and tmpfs, read from its loop")
    fleet_sub = fleet.add_subparsers(dest="fleet_command", metavar="FLEET_COMMAND")
    fleet_sub.required = True
    p = fleet_sub.add_parser(
        "status",
        parents=parents,
        help="every host of a fleet file side by side, from its loop's API (0, or 1 if a host did not answer)",
        description="Read every host of --fleet FILE (hosts: a list of name, url of its `reconciler run` listener, "
        "token_file) through GET /v1/status, in parallel, each within timeout_s (or --timeout), and show them side "
        "by side. A host that does not answer is shown as unreachable with why; its token is sent to it alone.",
    )
    p.add_argument("--fleet", required=True, metavar="FILE", help="the fleet file (YAML: hosts, timeout_s)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds each host has (over timeout_s)")
    p.set_defaults(func=Command("fleet", "cmd_fleet_status"))
