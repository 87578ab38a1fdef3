"""A leave never takes a container for gone from an engine list that did not answer: missing from a list that is
not whole says nothing of the container (the stop it needs is not skipped, and the outcome says why). Found by the
soak (seed 1005: a sleep left instead on such a list, "already gone", the lane still awake); the simulation's replay
is in tests/sim/test_sleeping_sim.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from planner_fixtures import make_desired, make_observed

from reconciler.apply.applier import Applier
from reconciler.apply.errors import ActionFailed
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.observed import Reading

CASE = {"recipes": {"omni": {"tp": 1}}, "manifest": []}
LEAVE = Action(
    kind=ActionKind.LEAVE, reason="t", recipe="omni", gpus=("dark-compute-a",), container="c-a", container_id="abc123"
)


def test_a_leave_on_a_list_the_engine_did_not_give_refuses_instead_of_calling_the_lane_gone() -> None:
    desired = make_desired(CASE)
    observed = make_observed(CASE, desired)
    applier = Applier(desired, connect=False)
    down = replace(observed, containers=(), docker=Reading("docker", False, "list timed out", "slow"))
    with pytest.raises(ActionFailed, match=r"not in the engine's list, which did not answer \(list timed out\)"):
        applier.leave(LEAVE, down)


def test_a_leave_on_a_whole_list_without_the_container_says_it_is_already_gone() -> None:
    desired = make_desired(CASE)
    observed = make_observed(CASE, desired)
    applier = Applier(desired, connect=False)
    assert observed.docker.ok
    assert applier.leave(LEAVE, replace(observed, containers=())) == ("c-a already gone", 0)
