"""The planner's sleeping lanes (docs/design.md, sleeping lanes): which lanes sleep and wake on a switch between
standby topologies, the cold enter of a standby lane that is missing, and rule 1 (never two awake lanes on one card)
at plan time — a wake blocked by a process on its card or by memory it would not find free.

Pure: DesiredState and Observed values built here (tests/planner_fixtures.py), the real planner.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from planner_fixtures import make_desired, make_observed

from reconciler.apply.errors import ActionRefused
from reconciler.apply.sleep import check_wake
from reconciler.cli.render import Style, render_plan
from reconciler.load.desired import standby_lanes
from reconciler.model import GIB, DesiredAssignment, DesiredState, Recipe
from reconciler.plan.actions import ActionKind, Plan
from reconciler.plan.observed import LaneMemory, Observed
from reconciler.plan.planner import plan

A, B = "dark-compute-a", "dark-compute-b"


def sleeping_recipe(tp: int, port: int, level: int = 1) -> Recipe:
    return Recipe.model_validate(
        {
            "tensor_parallel_size": tp,
            "model": {"id": "m"},
            "container": {
                "image": "img",
                "command": ["vllm", "serve", "m", "--enable-sleep-mode", "--port", str(port)],
                "env": {"VLLM_SERVER_DEV_MODE": "1"},
            },
            "health": {"url": f"http://127.0.0.1:{port}/health"},
            "sleep": {"level": level},
        }
    )


def desired_with(running: str, standby: tuple[str, ...] = ("split", "exclusive"), **case: Any) -> DesiredState:
    base = make_desired({"recipes": {"small": {}}, **case})
    recipes = {
        "small-a": sleeping_recipe(1, 8001),
        "small-b": sleeping_recipe(1, 8002),
        "big": sleeping_recipe(2, 8003),
    }

    def lane(name: str, *slots: str) -> DesiredAssignment:
        return DesiredAssignment(name, slots, recipes[name].content_hash(), 0)

    topologies = {"split": (lane("small-a", A), lane("small-b", B)), "exclusive": (lane("big", A, B),)}
    return replace(
        base,
        recipes=recipes,
        assignments=topologies[running],
        topology=running,
        topologies=topologies,
        standby_topologies=standby,
        standby=standby_lanes(topologies[running], [topologies[n] for n in standby if n != running]),
    )


LANES = {
    "small-a": ("reconciler-small-a-dark-compute-a", [A]),
    "small-b": ("reconciler-small-b-dark-compute-b", [B]),
    "big": ("reconciler-big-dark-compute-a-dark-compute-b", [A, B]),
}


def observed_with(
    desired: DesiredState,
    lanes: dict[str, bool | None],
    *,
    gpu_processes: dict[str, list[dict[str, Any]]] | None = None,
    memory: dict[str, LaneMemory] | None = None,
    **obs: Any,
) -> Observed:
    """The lanes running (recipe -> asleep by its own answer: True, False, or None for no answer)."""
    containers = [{"name": LANES[r][0], "managed": True, "recipe": r, "slots": LANES[r][1]} for r in lanes]
    o = make_observed({"observed": {"containers": containers, "gpu_processes": gpu_processes or {}, **obs}}, desired)
    ids = {c.recipe: c.id for c in o.containers}
    sleeping = {ids[r]: s for r, s in lanes.items() if s is not None}
    return replace(o, sleeping=sleeping, lane_memory={ids[r]: m for r, m in (memory or {}).items()})


def steps(p: Plan) -> list[tuple[str, str | None]]:
    return [(a.kind.value, a.recipe) for a in p.actions]


def test_a_switch_to_the_exclusive_lane_puts_the_split_to_sleep_and_wakes_it() -> None:
    d = desired_with("exclusive")
    p = plan(d, observed_with(d, {"small-a": False, "small-b": False, "big": True}))
    assert steps(p) == [("sleep", "small-a"), ("sleep", "small-b"), ("wake", "big")], p
    assert not p.blockers and not p.held
    # The two sleeps are on disjoint cards: they may run at once.
    assert {a.gpus for a in p.actions[:2]} == {(A,), (B,)}


def test_a_switch_back_sleeps_the_exclusive_lane_and_wakes_the_split() -> None:
    d = desired_with("split")
    p = plan(d, observed_with(d, {"small-a": True, "small-b": True, "big": False}))
    assert steps(p) == [("sleep", "big"), ("wake", "small-a"), ("wake", "small-b")], p


def test_converged_with_the_standby_lanes_asleep() -> None:
    d = desired_with("split")
    p = plan(d, observed_with(d, {"small-a": False, "small-b": False, "big": True}))
    assert p.converged, p
    assert set(p.satisfied) == {n for n, _ in LANES.values()}


def test_an_empty_host_enters_the_standby_lane_first_puts_it_to_sleep_then_enters_the_running_ones() -> None:
    d = desired_with("split")
    p = plan(d, observed_with(d, {}))
    assert steps(p) == [("enter", "big"), ("sleep", "big"), ("enter", "small-a"), ("enter", "small-b")], p
    sleep = p.actions[1]
    assert sleep.container_id is None and sleep.container == LANES["big"][0]
    assert "once its first enter is healthy, drain, then sleep" in sleep.reason


def test_a_missing_standby_lane_waits_for_a_switch_rather_than_darken_an_awake_lane() -> None:
    d = desired_with("split")
    p = plan(d, observed_with(d, {"small-a": False, "small-b": False}))
    assert steps(p) == [], p
    assert not p.blockers, p.blockers
    (held,) = p.held
    assert held.recipe == "big" and "at the next switch" in held.reason and LANES["small-a"][0] in held.reason


def test_a_lane_that_gives_no_answer_is_never_taken_for_asleep() -> None:
    """Rule 1: only the lane's own answer proves it asleep. The running lane that gives none is not woken (it may
    be awake); a standby lane that gives none is put to sleep (a sleep of a sleeping lane is harmless)."""
    d = desired_with("exclusive")
    p = plan(d, observed_with(d, {"small-a": None, "small-b": True, "big": None}))
    assert steps(p) == [("sleep", "small-a")], p


def test_a_foreign_process_on_the_card_blocks_the_wake_naming_its_pid() -> None:
    d = desired_with("exclusive")
    o = observed_with(
        d,
        {"small-a": True, "small-b": True, "big": True},
        gpu_processes={B: [{"pid": 4242, "command": "python train.py", "mib": 40000}]},
    )
    p = plan(d, o)
    assert [a.kind for a in p.actions] == [], p
    (b,) = p.blockers
    assert b.recipe == "big" and "pid 4242" in b.reason and b.holder == "pid 4242", b


def test_a_wake_whose_memory_is_not_free_beyond_the_reserve_is_blocked_naming_who_holds_it() -> None:
    d = desired_with("exclusive", telemetry="nvml", host={"gpu_reserve": {"free_gib": 3}})
    mem = LaneMemory(awake={A: 60 * GIB, B: 60 * GIB}, asleep={A: 2 * GIB, B: 2 * GIB})
    sleepers = [{"pid": 11, "container": LANES["small-a"][0], "mib": 2048}]
    o = observed_with(
        d,
        {"small-a": True, "small-b": True, "big": True},
        gpu_processes={A: [*sleepers, {"pid": 12, "container": LANES["big"][0], "mib": 2048}]},
        memory={"big": mem},
        gpu_memory_used_gib={A: 30, B: 4},  # of 80: 50 free on A, 76 on B
    )
    p = plan(d, o)
    assert steps(p) == [], p
    (b,) = p.blockers
    assert b.cause == "memory" and A in b.reason and "58.00 GiB" in b.reason and "pid 11" in b.reason, b
    # With the memory free, the same wake is planned.
    roomy = replace(o, gpus=make_observed_gpus(d, o, {A: 4, B: 4}))
    assert steps(plan(d, roomy)) == [("wake", "big")]


def make_observed_gpus(d: DesiredState, o: Observed, used_gib: dict[str, float]) -> Any:
    slots = {s: replace(v, memory_used_bytes=int(used_gib[s] * GIB)) for s, v in o.gpus.slots.items()}
    return replace(o.gpus, slots=slots)


def test_a_standby_lane_never_leaves_as_not_in_the_manifest() -> None:
    d = desired_with("split")
    p = plan(d, observed_with(d, {"small-a": False, "small-b": False, "big": True}))
    assert not [a for a in p.actions if a.kind is ActionKind.LEAVE]
    # Without standby: the same exclusive lane is not wanted, and leaves.
    plain = replace(d, standby=(), standby_topologies=())
    p = plan(plain, observed_with(plain, {"small-a": False, "small-b": False, "big": True}))
    assert steps(p) == [("leave", "big")], p


@pytest.mark.parametrize("asleep", [True, False])
def test_a_cold_enter_beside_a_sleeping_lane_is_not_blocked_by_it(asleep: bool) -> None:
    """A running lane's enter onto cards where a standby lane sleeps (or goes to sleep first) is placed."""
    d = desired_with("split")
    p = plan(d, observed_with(d, {"big": asleep}))
    want = [("enter", "small-a"), ("enter", "small-b")]
    assert steps(p) == ([] if asleep else [("sleep", "big")]) + want, p


@pytest.mark.parametrize(
    ("others", "procs", "refused"),
    [
        ({"small-a": True, "small-b": True}, {}, ""),
        ({"small-a": False, "small-b": True}, {}, "does not say it sleeps"),
        ({"small-a": None, "small-b": True}, {}, "does not say it sleeps"),
        ({"small-a": True, "small-b": True}, {B: [{"pid": 777, "command": "python hog.py"}]}, "pid 777"),
    ],
)
def test_right_before_the_call_a_wake_is_refused_unless_every_other_lane_on_its_cards_sleeps(
    others: dict[str, bool | None], procs: dict[str, list[dict[str, Any]]], refused: str
) -> None:
    """Rule 1 again in the apply layer, on the observation made right before POST /wake_up: an answer of the lanes
    themselves, not the plan's, and no process but the sleeping lanes' on the cards."""
    d = desired_with("exclusive")
    o = observed_with(d, {**others, "big": True}, gpu_processes=procs)
    big = next(c for c in o.containers if c.recipe == "big")
    if not refused:
        check_wake(d, big, o)
        return
    with pytest.raises(ActionRefused) as info:
        check_wake(d, big, o)
    assert refused in info.value.cause, info.value.cause


def test_right_before_the_call_a_foreign_container_on_its_cards_refuses_the_wake() -> None:
    d = desired_with("exclusive")
    o = observed_with(d, {"small-a": True, "small-b": True, "big": True})
    squatter = make_observed(
        {"observed": {"containers": [{"name": "squatter", "gpus": ["1"], "id": "ee" * 32}]}}, d
    ).containers[0]
    o = replace(o, containers=(*o.containers, squatter))
    big = next(c for c in o.containers if c.recipe == "big")
    with pytest.raises(ActionRefused) as info:
        check_wake(d, big, o)
    assert "squatter" in info.value.cause and info.value.reason == "gpu_held", info.value.cause


def test_a_blocked_wake_darkens_no_serving_lane() -> None:
    """Sleeping lanes rule 8: the split serves, tp2 sleeps, a foreign container holds card A. A switch to the exclusive
    topology would sleep both small lanes to make room for a wake that cannot run: neither sleeps, and the plan says
    they keep serving (the cold path's rule for a leave)."""
    d = desired_with("exclusive")
    o = observed_with(d, {"small-a": False, "small-b": False, "big": True})
    foreign = {"name": "someones-jupyter", "gpus": ["0"]}
    o = make_observed(
        {
            "observed": {
                "containers": [
                    *({"name": n, "managed": True, "recipe": r, "slots": s} for r, (n, s) in LANES.items()),
                    foreign,
                ]
            }
        },
        d,
    )
    ids = {c.recipe: c.id for c in o.containers if c.recipe}
    o = replace(o, sleeping={ids["small-a"]: False, ids["small-b"]: False, ids["big"]: True})
    p = plan(d, o)
    assert steps(p) == [], p
    assert {b.recipe for b in p.blockers} == {"big"}, p.blockers
    reasons = " ".join(b.reason for b in p.blockers)
    assert "someones-jupyter" in reasons, reasons
    # Our own lanes kept awake are said as such, not counted as the wake's causes.
    assert "small-" not in reasons, reasons
    assert p.kept_serving == (LANES["small-a"][0], LANES["small-b"][0]), p
    text = render_plan(p, None, Style(color=False))
    assert f"{LANES['small-b'][0]} keeps serving: what would replace it is blocked" in text, text
    # With the foreign container gone, the switch runs as before.
    clear = replace(o, containers=tuple(c for c in o.containers if c.recipe))
    assert steps(plan(d, clear)) == [("sleep", "small-a"), ("sleep", "small-b"), ("wake", "big")]


def test_blocked_counts_the_problems_not_our_lanes_kept_serving_and_the_hint_fits() -> None:
    """'Blocked: N problem(s)' counts what the operator must act on: a blocker that names a lane of ours kept serving
    where the blocked lane would go is not a problem of its own, and its 'never stops what it does not own' hint does
    not apply to it."""
    from reconciler.plan.actions import Blocker
    from reconciler.plan.causes import BlockerCause

    ours = LANES["small-b"][0]
    foreign = Blocker(
        "big",
        (A, B),
        "container jupyter holds GPU slot dark-compute-a and is not managed by this tool",
        "jupyter",
        cause=BlockerCause.HELD,
    )
    kept = Blocker(
        "other",
        (B,),
        f"{ours} holds GPU slot {B} and keeps serving it: the lane that would replace it there is blocked",
        ours,
        cause=BlockerCause.HELD,
    )
    text = render_plan(Plan(host="h", blockers=(foreign, kept), kept_serving=(ours,)), None, Style(color=False))
    assert "Blocked: 1 problem(s)" in text, text
    only_ours = render_plan(Plan(host="h", blockers=(kept,), kept_serving=(ours,)), None, Style(color=False))
    assert "Blocked: 1 problem(s)" in only_ours, only_ours  # a plan blocked by nothing else still says it is blocked
