"""``reconciler apply``: one converge pass with the plan shown first. Exit 0 converged, 3 blocked, 1 failed; and
``switch``, ``promote``, ``sync``, ``adopt``, ``prune`` and ``probe`` beside it.

Registered by ``reconciler.cli``: their options here, their handlers in ``reconciler.cli.commands.apply``, loaded
when one of them runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.base.requests import DEFAULT_SUITE, PROBE_SUITES
from reconciler.cli.common import Command


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("apply", parents=parents, help="one converge pass (0 converged, 3 blocked, 1 failed)")
    p.add_argument(
        "plan_file",
        nargs="?",
        metavar="FILE",
        help="a plan saved by `reconciler plan --out FILE`: apply exactly it, refused when the host or files changed",
    )
    p.add_argument(
        "--yes", "-y", action="store_true", help="approve the plan shown without asking (needed without a terminal)"
    )
    p.set_defaults(func=Command("apply", "cmd_apply"))
    p = sub.add_parser(
        "switch",
        parents=parents,
        help="run another named topology: set the manifest's topology: to NAME, every other byte kept",
        description="Set the manifest's topology: to NAME (one of its topologies:), keeping every other byte of the "
        "file; refused when NAME is unknown or the file changed meanwhile. The loop converges it as it would a hand "
        "edit; with --wait the pass runs now, as `apply --yes` runs it, and the exit code is apply's.",
    )
    p.add_argument("name", metavar="NAME", help="the topology to run")
    p.add_argument("--wait", action="store_true", help="converge now, as `apply --yes` does (0 converged, 3 blocked)")
    p.set_defaults(func=Command("apply", "cmd_switch"))
    p = sub.add_parser(
        "promote",
        parents=parents,
        help="move an alias to RECIPE when its evidence for the recipe's current hash passes every gate of the alias",
        description="Set the recipe the manifest's alias ALIAS names to RECIPE, keeping every other byte of the file, "
        "only when the kept qualification evidence (`reconciler qualify`) for RECIPE's current hash passes every gate "
        "of the alias (its long form's gates:); otherwise refused, naming each failed gate with its figure. With "
        "--wait the pass runs now, as `apply --yes` runs it, and the exit code is apply's.",
    )
    p.add_argument("alias", metavar="ALIAS", help="the alias, a name under the manifest's aliases:")
    p.add_argument("recipe", metavar="RECIPE", help="the recipe it is to name")
    p.add_argument("--wait", action="store_true", help="converge now, as `apply --yes` does (0 converged, 3 blocked)")
    p.set_defaults(func=Command("apply", "cmd_promote"))
    p = sub.add_parser(
        "sync",
        parents=parents,
        help="fetch the host's git source now (0 newest commit in use or waiting, 1 refused, stopped or unreachable)",
        description="Fetch source.ref of the host file's source.git and take its newest commit when its files "
        "validate and, with source.after, every canary host reports it converged. A commit refused or stopped keeps "
        "the commit in use. The loop fetches on its own every source.interval_s; it converges what this takes.",
    )
    p.set_defaults(func=Command("apply", "cmd_sync"))

    p = sub.add_parser(
        "adopt",
        parents=parents,
        help="make containers with this host's labels but no install id (an earlier version's) this install's",
    )
    p.add_argument("containers", nargs="+", metavar="CONTAINER", help="name or id")
    p.set_defaults(func=Command("apply", "cmd_adopt"))

    p = sub.add_parser(
        "prune",
        parents=parents,
        help="the failed containers kept for their logs: a dry run unless --confirm removes them (0 done, 1 failed)",
    )
    p.add_argument("--confirm", action="store_true", help="remove them (default: only show them)")
    p.set_defaults(func=Command("apply", "cmd_prune"))

    p = sub.add_parser(
        "probe",
        parents=parents,
        help="run a recipe's functional probes against its running lane (0 all passed, 1 any failed)",
    )
    p.add_argument("recipe", metavar="RECIPE", help="the recipe's name (its file stem under configs/recipes/)")
    p.add_argument(
        "--suite",
        choices=PROBE_SUITES,
        default=DEFAULT_SUITE,
        help="which probes: preflight (what every enter runs), regression (on demand), or all (default: %(default)s)",
    )
    p.set_defaults(func=Command("apply", "cmd_probe"))
