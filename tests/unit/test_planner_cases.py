"""The planner's behaviour, one YAML case a file under tests/cases/plan/: desired + observed -> expected plan.

Each case's ``why`` reads as documentation; the table is the specification of ``reconciler.plan.planner.plan``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from planner_fixtures import make_desired, make_observed

from reconciler.plan.actions import ActionKind
from reconciler.plan.planner import plan

CASES = sorted((Path(__file__).parent.parent / "cases" / "plan").glob("*.yaml"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_plan_case(path: Path) -> None:
    case = yaml.safe_load(path.read_text())
    assert case.get("why"), f"{path.name}: every case says why"
    desired = make_desired(case)
    observed = make_observed(case, desired)
    last_good = tuple((r, tuple(s)) for entry in case.get("last_good") or [] for r, s in entry.items())
    p = plan(desired, observed, hold=case.get("hold"), last_good=last_good, next_attempt=case.get("next_attempt"))
    exp = case["expect"]

    got = [[a.kind.value, a.recipe, list(a.gpus)] for a in p.actions]
    if "actions" in exp:
        assert got == exp["actions"], f"{path.name}: {case['why']}"
    assert p.blocked is bool(exp.get("blocked", False)), [b.reason for b in p.blockers]
    assert list(p.unavailable) == exp.get("unavailable", [])
    blob = " | ".join(b.reason for b in p.blockers)
    for needle in exp.get("blockers", []):
        assert needle in blob, f"{needle!r} not in blockers: {blob}"
    reasons = " | ".join(a.reason for a in p.actions)
    for needle in exp.get("reasons", []):
        assert needle in reasons, f"{needle!r} not in reasons: {reasons}"
    if "exit_codes" in exp:
        assert [a.exit_code for a in p.actions] == exp["exit_codes"], f"{path.name}: {case['why']}"
    if "converged" in exp:
        assert p.converged is exp["converged"]
    if "held" in exp:
        assert len(p.held) == exp["held"]
    if "fallbacks" in exp:
        assert [f.text for f in p.fallbacks] == exp["fallbacks"], f"{path.name}: {case['why']}"
    if "leave_paths" in exp:
        assert [p for a in p.actions if a.kind is ActionKind.LEAVE for p in a.paths] == exp["leave_paths"]
    if "reclaim_paths" in exp:
        (r,) = [a for a in p.actions if a.kind is ActionKind.RECLAIM]
        assert len(r.paths) == exp["reclaim_paths"]


def test_order_is_leaves_then_reclaim_then_enters() -> None:
    case = yaml.safe_load(
        (Path(__file__).parent.parent / "cases" / "plan" / "14-orphans-reclaimed-before-enter.yaml").read_text()
    )
    case["recipes"]["omni"] = {"tp": 1}
    case["observed"]["containers"] = [
        {"name": "reconciler-omni-dark-compute-b", "managed": True, "recipe": "omni", "slots": ["dark-compute-b"]}
    ]
    desired = make_desired(case)
    kinds = [a.kind for a in plan(desired, make_observed(case, desired)).actions]
    assert kinds == [ActionKind.LEAVE, ActionKind.RECLAIM, ActionKind.ENTER]


def test_plan_is_pure_and_repeatable() -> None:
    case = yaml.safe_load((Path(__file__).parent.parent / "cases" / "plan" / "03-split-to-exclusive.yaml").read_text())
    desired = make_desired(case)
    observed = make_observed(case, desired)
    assert plan(desired, observed) == plan(desired, observed)


def test_json_shape_is_the_contract() -> None:
    case = yaml.safe_load((Path(__file__).parent.parent / "cases" / "plan" / "03-split-to-exclusive.yaml").read_text())
    desired = make_desired(case)
    data = plan(desired, make_observed(case, desired)).to_json()
    assert {"host", "changes", "blocked", "actions"} <= set(data)
    assert data["changes"] is True and data["blocked"] is False
    for a in data["actions"]:
        assert {"kind", "recipe", "gpus", "container", "paths", "reason"} <= set(a)
        assert a["kind"] in ("leave", "enter", "reclaim")
