"""Exit codes a script can trust (docs/design.md, "The command line"): ``plan`` 0 only when the host is as wanted,
4 while a wanted lane is held in backoff; plain ``status`` 0 as the contract says, and ``status --check`` the
verdict (0 as wanted, 2 converging, 3 blocked, 4 held), on a real engine and a real loop (issue 44, item 7)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from e2e_helpers import SLEEP, LoopProcess, Root

from reconciler.plan.actions import Action, ActionKind, Blocker, Held, Plan
from reconciler.plan.causes import BlockerCause
from reconciler.service.results import EXIT_HELD, plan_exit_code

A, B = "dark-compute-a", "dark-compute-b"


def _codes(root: Root) -> tuple[int, int, int]:
    """(plan, status, status --check)."""
    return root.cli("plan").rc, root.cli("status").rc, root.cli("status", "--check").rc


@pytest.mark.docker
@pytest.mark.root
def test_plan_and_status_check_say_converging_blocked_and_as_wanted(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    assert _codes(root) == (2, 0, 2), "changes pending: converging"
    assert root.apply().rc == 0
    assert _codes(root) == (0, 0, 0), "as wanted"
    squatter = root.run_unmanaged("squatter", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}", *SLEEP)
    root.manifest((omni, [A]))
    assert _codes(root) == (3, 0, 3), "blocked: plain status keeps its 0"
    root.api.remove_container(squatter, force=True)


@pytest.mark.docker
@pytest.mark.root
def test_a_lane_held_in_backoff_is_exit_4_for_plan_and_status_check(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni", mode="fail-start")
    root.manifest((omni, [B]))
    lp = start_loop("--backoff-base", "120").started()
    lp.wait("backoff", timeout=30)
    plan = root.cli("plan", "--json")
    assert plan.data["held"] and not plan.data["actions"] and not plan.data["blocked"], plan
    assert plan.rc == EXIT_HELD == 4, plan
    assert root.cli("plan").rc == 4
    assert root.cli("status").rc == 0
    assert root.cli("status", "--check").rc == 4


def test_the_codes_of_a_plan() -> None:
    enter = Action(ActionKind.ENTER, "wanted", recipe="omni", gpus=(B,))
    held = Held("lane", (A, B), "in backoff; next try in 59 s")
    blocker = Blocker("lane", (A,), "a foreign container holds it", "c", cause=BlockerCause.HELD)
    assert plan_exit_code(Plan(host="h")) == 0
    assert plan_exit_code(Plan(host="h", held=(held,))) == 4  # 0 on the code before: "nothing to do"
    assert plan_exit_code(Plan(host="h", actions=(enter,), held=(held,))) == 2
    assert plan_exit_code(Plan(host="h", blockers=(blocker,), held=(held,))) == 3
    assert plan_exit_code(Plan(host="h", actions=(enter,), unavailable=("gpu",))) == 1
