"""The handler of ``reconciler validate`` (registered by ``reconciler.cli``): the files loaded and checked, nothing
observed. Loaded when it runs.
"""

from __future__ import annotations

import argparse

from reconciler.base.terminal import emit_json
from reconciler.cli.common import EXIT_OK, console
from reconciler.load.desired import load_desired
from reconciler.load.files import HOST_FILE


def cmd_validate(args: argparse.Namespace) -> int:
    desired = load_desired(args.root)
    src = desired.host.source
    warnings = [f"{HOST_FILE}: {w}" for w in src.warnings()] if src is not None else []
    if args.json:
        emit_json(
            {
                "valid": True,
                "warnings": warnings,
                "host": desired.host.name,
                "manifest": desired.manifest_path,
                "recipes": sorted(desired.recipes),
                "assignments": [
                    {"recipe": a.recipe, "gpus": list(a.slots), "recipe_hash": a.recipe_hash}
                    for a in desired.assignments
                ],
            }
        )
    else:
        print(
            f"valid: host {desired.host.name}, {len(desired.recipes)} recipe(s), "
            f"{len(desired.assignments)} assignment(s) in {desired.manifest_path}",
            file=console(args).out,
        )
        for w in warnings:
            print(f"warning: {w}", file=console(args).err)
    return EXIT_OK
