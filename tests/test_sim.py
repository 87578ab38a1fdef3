"""The simulated host under the project's real loader, planner, apply layer and loop (tests/sim/): a fixed,
derandomised budget of hypothesis's stateful steps, each followed by the invariant checks. ``make soak`` runs a long
one; every failing sequence it finds becomes a case here or in tests/cases/plan/."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, settings
from sim.machine import HostMachine

EXAMPLES = int(os.environ.get("SIM_EXAMPLES", "1200"))


TestSimulatedHost = HostMachine.TestCase
TestSimulatedHost.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# ---------------------------------------------------------------- sequences the simulation found, kept as cases


def _machine(shape: str = "index", telemetry: str = "nvml") -> HostMachine:
    m = HostMachine()
    m.setup(seed=7, shape=shape, gpu_requests=True, wsl2=False, tmpfs_gib=20.0, telemetry=telemetry)
    return m


def test_an_engine_error_after_start_goes_through_the_failed_enter_path() -> None:
    """The start of the TP=2 lane takes effect but its answer is lost (a 5xx after every retry): the container is
    stopped and kept like any failed enter, so the fallback that follows never shares its cards."""
    m = _machine()
    try:
        m.edit_manifest("split")
        m.loop_pass()
        m.edit_manifest("exclusive")
        m.world.lost["start"] = 1.0
        m.loop_pass()
        states = {c.name: c.state for c in m.world.containers.values()}
        assert not [n for n, st in states.items() if st == "running"], states
        assert any(n.startswith("reconciler-big-") and "-failed-" in n for n in states), states
        m.world.lost.clear()
        m.world.advance(1.0)
        m.loop_pass()
        m.no_violation()
    finally:
        m.teardown()


def test_apply_removes_only_the_files_its_plan_listed() -> None:
    """A leave reclaims the files its plan lists (its own, and the orphans its offload container kept from reclaim),
    never every orphan it finds then."""
    m = _machine()
    try:
        m.edit_manifest("exclusive")
        m.cli_apply()
        m.orphan_appears(1)
        m.edit_manifest("split")
        m.cli_apply()
        assert not m.world.files, sorted(m.world.files)
        m.no_violation()
    finally:
        m.teardown()


def test_a_failed_enter_whose_container_cannot_be_renamed_still_says_why_it_failed() -> None:
    """Keeping a failed container can itself fail (the engine refuses the rename for good): the enter still fails
    with its own cause, the container stopped, and the next pass tries again."""
    m = _machine()
    try:
        m.recipe_behaves("omni", "crash")
        m.edit_manifest("split")
        m.world.faults["rename"] = 1.0
        result = m.loop.cycle({"resync"})
        (enter,) = [o for o in result.outcomes if o.action.kind.value == "enter"]
        assert enter.result == "failed" and "exited with code 1" in enter.detail, enter.detail
        assert "not renamed" in enter.detail, enter.detail
        assert not [c for c in m.world.containers.values() if c.state == "running"]
        m.no_violation()
    finally:
        m.teardown()


def test_without_telemetry_a_card_named_by_uuid_holds_every_slot_named_by_index() -> None:
    """gpu_telemetry none, slots by index, a foreign container given its card by UUID: nothing can tell which slot
    that is, so it holds them all and the enter waits (it entered on that card before: seed 11 of the soak)."""
    m = _machine(telemetry="none")
    try:
        m.edit_manifest("exclusive")
        m.foreign_container(card=0, by="uuid", kind="foreign", running=True)
        m.cli_apply()
        assert not [c for c in m.world.containers.values() if c.ours], m.world.containers
        plan = m.plan_json()
        assert plan["blocked"], plan
        assert "which nothing here matches to a slot without GPU telemetry" in json.dumps(plan), plan
        m.no_violation()
    finally:
        m.teardown()


def test_a_container_podman_is_stopping_still_holds_its_card() -> None:
    """Podman's API says "stopping" while a stop's grace period runs and the processes still hold the card: under
    gpu_telemetry none nothing else says so, and the slot is free only once it has exited."""
    m = _machine(telemetry="none")
    try:
        m.foreign_container(card=1, by="index", kind="foreign", running=True)
        m.loop_pass()
        m.operator_stops_slowly(pick=0, grace=120.0)
        m.edit_manifest("split")
        m.loop_pass()
        assert not [c for c in m.world.containers.values() if c.ours], m.world.containers
        m.time_passes(400.0)
        m.loop_pass()
        assert [c.name for c in m.world.containers.values() if c.ours and c.state == "running"] == [
            "reconciler-omni-dark-compute-b"
        ]
        m.no_violation()
    finally:
        m.teardown()


def test_an_idle_privileged_container_holds_every_card() -> None:
    """A foreign container run with --privileged that runs nothing on any card (NVML lists no process of it): only
    the engine says it sees every card, and no lane is entered beside it (the soak's seed 8 entered one on the code
    before)."""
    m = _machine()
    try:
        m.foreign_container(card=0, by="privileged", kind="foreign", running=True, idle=True)
        m.edit_manifest("split")
        m.faults_stop_and_host_settles()
        assert not [c for c in m.world.containers.values() if c.ours], m.world.containers
        assert "it runs privileged" in json.dumps(m.plan_json())
        m.no_violation()
    finally:
        m.teardown()


def test_device_nodes_and_mig_ids_hold_their_cards_idle_or_not() -> None:
    """Idle foreign containers given card 1 by its device node, a CDI name and a MIG device: the lane on the card of
    dark-compute-b is blocked by it, and under NVML (which tells each card's minor number and MIG devices) the other
    card is free: its lane is planned."""
    for by in ("device-node", "cdi", "mig-uuid", "mig-index"):
        m = _machine()
        try:
            m.foreign_container(card=1, by=by, kind="foreign", running=True, idle=True)
            m.edit_manifest("swapped")
            plan = m.plan_json()
            assert [(b["recipe"], b["gpus"], b["cause"]) for b in plan["blockers"]] == [
                ("small", ["dark-compute-b"], "held")
            ], (by, plan)
            assert [(a["kind"], a["gpus"]) for a in plan["actions"]] == [("enter", ["dark-compute-a"])], (by, plan)
            # Blockers are scoped to their slots: the free card's lane enters, nothing of ours lands on card 1.
            m.loop_pass()
            ours = [c for c in m.world.containers.values() if c.ours and c.state == "running"]
            assert [c.name for c in ours] == ["reconciler-omni-dark-compute-a"], (by, m.world.containers)
            m.no_violation()
        finally:
            m.teardown()


def test_a_copy_of_a_lane_with_every_label_is_never_touched() -> None:
    """A copy of this install's running lane made from its labels (its install id and create token included), on
    the same card: not a duplicate to remove, and an empty manifest stops the lane, never the copy."""
    m = _machine()
    try:
        m.edit_manifest("split")
        m.loop_pass()
        m.foreign_container(card=0, by="none", kind="copied", running=True)
        copies = [c for c in m.world.containers.values() if not c.ours]
        assert len(copies) == 1 and copies[0].labels.get("io.reconciler.install") == m.world.install_id
        m.loop_pass()
        m.edit_manifest("empty")
        m.loop_pass()
        m.cli_apply()
        assert copies[0].id in m.world.containers and copies[0].state == "running"
        assert not [c for c in m.world.containers.values() if c.ours and c.state == "running"]
        m.no_violation()
    finally:
        m.teardown()


def test_a_plan_saved_before_the_host_changed_is_stale_and_writes_nothing() -> None:
    """A second terminal saves a plan, an orphan appears and a reader lets go of a file meanwhile, and the plan is
    applied steps later: stale, nothing written; saved again and applied at once, it runs exactly its steps."""
    m = _machine()
    try:
        m.edit_manifest("split")
        m.plan_saved()
        m.orphan_appears(1)
        mark = len(m.world.writes)
        m.saved_plan_applied(0)
        m.no_violation()
        assert m.world.writes[mark:] == [], "a stale saved plan wrote"
        assert m.world.containers == {} or all(not c.ours for c in m.world.containers.values())
        m.plan_saved()
        m.saved_plan_applied(1)
        m.no_violation()
        assert [c.name for c in m.world.containers.values() if c.ours], "the fresh saved plan ran"
        # The prompt: shown, the host changes (another orphan), answered: stale, nothing written.
        m.edit_manifest("empty")
        m.prompt_shown()
        m.orphan_appears(1)
        mark = len(m.world.writes)
        m.prompt_answered()
        m.no_violation()
        assert m.world.writes[mark:] == []
    finally:
        m.teardown()
