"""An approved pass's own consequences (docs/design.md, safety rule 13): the prune of a container one of its leaves
stopped and kept for its logs is left to the next plan and named in the pass's message, while any other step the
approved plan does not hold still ends the pass; the loop (no approved plan) runs every step. The real engine's
case, a lane deaf to SIGTERM killed at its stop timeout, is tests/real/test_apply_words.py."""

from __future__ import annotations

import pytest
from planner_fixtures import make_desired, make_observed

from reconciler.apply.passes import PassRun
from reconciler.apply.results import Outcome
from reconciler.plan.actions import Action, ActionKind, Plan

CASE = {"recipes": {"omni": {"tp": 1}}, "manifest": []}
LEAVE = Action(ActionKind.LEAVE, "not in the manifest", "omni", ("dark-compute-a",), "lane-a", "aaa111")
KEPT = Action(ActionKind.PRUNE, "kept for its logs", "omni", (), "lane-a-failed-1", "aaa111")
OTHER = Action(ActionKind.PRUNE, "kept for its logs", "omni", (), "old-failed-1", "bbb222")


def _pass(*, approved: Plan | None, result: str = "ok") -> PassRun:
    desired = make_desired(CASE)
    observed = make_observed(CASE, desired)
    first = Plan(host="h", actions=(LEAVE,))
    run = PassRun(first, observed, Plan(host="h", actions=(KEPT, OTHER)), limit=8, approved=approved)
    run.outcomes.append(Outcome(LEAVE, result, 1.0, "exited with code 137: kept as lane-a-failed-1 for its logs"))  # type: ignore[arg-type]
    return run


def test_the_prune_of_what_its_own_leave_kept_is_left_to_the_next_plan() -> None:
    run = _pass(approved=Plan(host="h", actions=(LEAVE,)))
    assert run.kept() == [KEPT] and run.todo() == [OTHER], "another container's prune is still a change of the host"
    assert (
        run.with_kept("") == "kept lane-a-failed-1 for its logs (stopped by this pass's leave; the next plan prunes it)"
    )
    assert run.with_kept("held").startswith("held; kept lane-a-failed-1")


@pytest.mark.parametrize(
    ("approved", "result"),
    [(None, "ok"), (Plan(host="h", actions=(LEAVE,)), "failed"), (Plan(host="h", actions=(LEAVE, KEPT)), "ok")],
    ids=["the loop prunes at once", "a failed leave is the news", "a prune the plan showed runs"],
)
def test_otherwise_every_step_is_the_passs_to_run(approved: Plan | None, result: str) -> None:
    run = _pass(approved=approved, result=result)
    assert run.kept() == [] and run.todo() == [KEPT, OTHER] and run.with_kept("m") == "m"
