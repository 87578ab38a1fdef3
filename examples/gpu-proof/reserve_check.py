"""The enter's free-VRAM reserve check, on the real NVML answer of this machine.

There is no Docker engine where the GPU proof runs, so no enter can be made. This script makes the same call the
apply layer makes once an enter's lane is healthy and settled: ``Applier.check_reserve(action, observed)`` with
``observed`` a real observation (NVML for the GPU; the stand-in engine for Docker) and ``action`` the enter the
manifest asks for. Under ``enforce`` it must raise ``BelowReserve`` (the enter is failed, and ``Applier.enter``
hands it to ``_fail_enter``); under ``report`` it must return the verdict and let the lane stay.

Usage: reserve_check.py ROOT EXPECT   (EXPECT: failed | stays). Prints one JSON line; exit 0 when as expected.
"""

from __future__ import annotations

import json
import sys

from reconciler.apply.applier import Applier
from reconciler.apply.errors import BelowReserve
from reconciler.load.desired import load_desired
from reconciler.model import container_name
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.vram import enter_reserve_verdict


def main() -> int:
    root, expect = sys.argv[1], sys.argv[2]
    desired = load_desired(root)
    (lane,) = desired.assignments
    action = Action(
        kind=ActionKind.ENTER,
        reason="reserve proof",
        recipe=lane.recipe,
        gpus=lane.slots,
        container=container_name(lane.recipe, lane.slots),
        recipe_hash=lane.recipe_hash,
    )
    applier = Applier(desired, connect=False)
    observed = applier.observe()
    out: dict = {
        "root": root,
        "policy": desired.reserve_policy(lane.recipe),
        "gpu_source": observed.gpus.reading.render(),
    }
    try:
        verdict = applier.check_reserve(action, observed)
        out.update(result="stays", verdict=verdict.to_json(), message=verdict.message())
    except BelowReserve as exc:
        # The verdict the check failed on: the same call on the same observation (the applier keeps its figures
        # per running action, for the outcome, and none runs here).
        verdict = enter_reserve_verdict(desired, action.recipe, observed.gpus, action.gpus)
        out.update(result="failed", cause=exc.cause, verdict=verdict.to_json())
    print(json.dumps(out))
    return 0 if out["result"] == expect else 1


if __name__ == "__main__":
    raise SystemExit(main())
