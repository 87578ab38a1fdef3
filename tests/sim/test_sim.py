"""The simulated host under the project's real loader, planner, apply layer and loop (tests/sim/): a fixed,
derandomised budget of hypothesis's stateful steps, each followed by the invariant checks. ``make soak`` runs a long
one; every failing sequence it finds becomes a case here or in tests/cases/plan/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sim.machine import HostMachine, budget
from sim.seams import installed, sim_scan
from sim.world import World

EXAMPLES = int(os.environ.get("SIM_EXAMPLES", "1200"))


TestSimulatedHost = HostMachine.TestCase
TestSimulatedHost.settings = budget(EXAMPLES)


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


def test_device_cgroup_rules_hold_the_cards_their_nodes_reach() -> None:
    """Idle foreign containers with a device cgroup rule for the cards' major (c 195:* rmw): with CAP_MKNOD kept or
    /dev bound in they can open every card's node, so neither lane enters; with card 1's node bound in they hold
    card 1 only; with neither (CAP_MKNOD dropped, no node) they hold nothing and both lanes enter. docs/design.md,
    safety rule 11."""
    for by, entered in (
        ("cgroup-rule-mknod", []),
        ("cgroup-rule-dev", []),
        ("cgroup-rule-bound", ["reconciler-omni-dark-compute-a"]),
        ("cgroup-rule-alone", ["reconciler-omni-dark-compute-a", "reconciler-small-dark-compute-b"]),
    ):
        m = _machine()
        try:
            m.foreign_container(card=1, by=by, kind="foreign", running=True, idle=True)
            m.edit_manifest("swapped")
            m.loop_pass()
            ours = sorted(c.name for c in m.world.containers.values() if c.ours and c.state == "running")
            assert ours == entered, (by, ours)
            m.no_violation()
        finally:
            m.teardown()


def test_a_process_holding_a_card_node_open_holds_the_card() -> None:
    """A process that opened card 1's node and has no CUDA context (NVML lists it nowhere), on the host or in a
    foreign container whose configuration gives it no card: the lane on card 1 waits, named by its pid, the other
    enters; once the holder ends, the waiting lane enters too."""
    for where in ("host", "container"):
        m = _machine()
        try:
            m.card_node_opened(card=1, where=where)
            m.edit_manifest("swapped")
            plan = m.plan_json()
            assert [(b["recipe"], b["gpus"]) for b in plan["blockers"]] == [("small", ["dark-compute-b"])], plan
            assert "holds /dev/nvidia" in json.dumps(plan["blockers"]), plan
            m.loop_pass()
            ours = [c.name for c in m.world.containers.values() if c.ours and c.state == "running"]
            assert ours == ["reconciler-omni-dark-compute-a"], (where, ours)
            if where == "host":
                m.foreign_gpu_processes_end()
            else:
                m.operator_removes_foreign(pick=0)
            m.loop_pass()
            ours = sorted(c.name for c in m.world.containers.values() if c.ours and c.state == "running")
            assert ours == ["reconciler-omni-dark-compute-a", "reconciler-small-dark-compute-b"], (where, ours)
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


# ---------------------------------------------------------------- the shm guard's holes (the scan, two offload lanes)


def _files_by_maker(m: HostMachine) -> dict[str, str]:
    return {f.name: f.maker for f in m.world.files.values()}


@pytest.mark.parametrize("every", [1, 2, 5])
def test_a_mapping_handed_down_by_fork_during_the_scan_is_never_unlinked(every: int) -> None:
    """A prefork chain maps an orphan-looking file and forks a new holder (a reused pid number at times) every
    ``every`` reads of /proc: the scan lists again until no unread pid appears and finds the chain's newest pid
    (owned), or, handed down at every read, never settles and fails closed (blocked); either way the file stays,
    and the lease gate is never the only thing that kept it (the checker says so if it were)."""
    m = _machine()
    try:
        m.orphan_appears(1)
        m.fork_chain_maps_file(pick=0, every=every, reuse=True)
        for _ in range(3):
            m.loop_pass()
            m.cli_apply()
        assert len(m.world.files) == 1, _files_by_maker(m)
        [f] = m.world.files.values()
        scan = sim_scan(m.world)
        assert bool(scan.unstable) if every == 1 else f.inode in scan.holders(), (scan.rounds, scan.unstable)
        m.no_violation()
        m.readers_exit(now=True)
        m.loop_pass()
        assert not m.world.files, _files_by_maker(m)
        m.no_violation()
    finally:
        m.teardown()


def test_the_checker_catches_a_scan_that_lists_proc_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The checker has teeth: with the scan's re-listing taken away (one listing, as before), the fork chain's
    file is judged orphan, and the only thing that keeps it is the lease gate, which the checker reports."""
    import reconciler.observe.proc_settle as proc_settle

    monkeypatch.setattr(proc_settle, "settle_scan", lambda scan, **kw: scan)
    m = _machine()
    try:
        m.orphan_appears(1)
        m.fork_chain_maps_file(pick=0, every=1, reuse=False)
        m.loop_pass()
        assert len(m.world.files) == 1
        assert any("the /proc scan missed" in v for v in m.world.violations), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def test_two_offload_lanes_converge_after_one_dies() -> None:
    """Two native-offload lanes; one crashes and leaves its file: the other lane is settled and seen holding its
    own, so the dead lane's file is an orphan that goes (it was kept forever while any offload lane ran)."""
    m = _machine()
    try:
        m.edit_manifest("two-offload")
        m.cli_apply()
        assert len(m.world.files) == 2, _files_by_maker(m)
        medium = next(c for c in m.world.containers.values() if c.name.startswith("reconciler-medium"))
        m.world._exit(medium, 1)
        m.faults_stop_and_host_settles()
        live = {f"container:{c.id}" for c in m.world.containers.values() if c.state == "running"}
        assert set(_files_by_maker(m).values()) <= live, (_files_by_maker(m), live)
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


def test_one_of_two_offload_lanes_leaves_and_its_file_goes() -> None:
    """The leave of one native-offload lane while the other runs reclaims its file and meets its postcondition
    (it failed on every pass: the running lane kept the file from reclaim)."""
    m = _machine()
    try:
        m.edit_manifest("two-offload")
        m.cli_apply()
        m.edit_manifest("one-offload")
        m.cli_apply()
        small = [c for c in m.world.containers.values() if c.state == "running"]
        assert [c.name for c in small] == ["reconciler-small-dark-compute-a"]
        assert set(_files_by_maker(m).values()) == {f"container:{small[0].id}"}, _files_by_maker(m)
        assert m.plan_json()["actions"] == []
        m.no_violation()
    finally:
        m.teardown()


def test_a_leave_keeps_a_file_its_container_shares_and_still_converges() -> None:
    """A reader maps the offload file of the lane that leaves: the plan lists no file for the leave (the file has
    another holder), the leave removes none and meets its postcondition (it tried to reclaim the file, which the
    guard kept, and failed its pass on that file); once the reader exits, the file is an orphan and goes."""
    m = _machine()
    try:
        m.edit_manifest("exclusive")
        m.loop_pass()
        m.process_takes_file(pick=0, via="map", now=True)
        m.edit_manifest("split")
        result = m._pass()
        assert result is not None and result.result == "converged", (result.result, result.message)
        running = [c.name for c in m.world.containers.values() if c.ours and c.state == "running"]
        assert running == ["reconciler-omni-dark-compute-b"], m.sink.lines
        assert len(m.world.files) == 1 and m.plan_json()["actions"] == [], m.plan_json()
        m.readers_exit(now=True)
        m.loop_pass()
        assert not m.world.files
        m.no_violation()
    finally:
        m.teardown()


def test_a_failed_enter_leaves_a_pattern_file_another_program_wrote_meanwhile() -> None:
    """Another program writes a pattern file while an enter waits for health, and the enter fails: the failed
    enter removes only what its container was seen holding, never that file (it removed every file new since its
    create)."""
    m = _machine()
    try:
        m.recipe_behaves("small", "crash")
        m.edit_manifest("one-offload")
        m.other_program_writes_pattern_file(held=False, now=False, gib=1)
        m.cli_apply()
        assert "program:writer" in _files_by_maker(m).values(), _files_by_maker(m)
        m.no_violation()
    finally:
        m.teardown()


def test_a_leave_reclaims_its_own_file_while_a_foreign_offload_container_runs() -> None:
    """Someone else's native-offload vLLM runs beside our offload lane; our lane leaves: the file only its container
    was seen holding goes (no running container can be making it), the foreign one's stays, and the pass converges
    (it failed on every pass: the foreign container kept our lane's file blocked)."""
    m = _machine()
    try:
        m.edit_manifest("one-offload")
        m.loop_pass()
        m.foreign_offload_container(holds_file=True)
        m.edit_manifest("empty")
        result = m._pass()
        assert result is not None and result.result == "converged", (result.result, result.message)
        assert set(_files_by_maker(m).values()) == {
            f"container:{c.id}" for c in m.world.containers.values() if not c.ours
        }, _files_by_maker(m)
        m.no_violation()
    finally:
        m.teardown()


def test_two_fork_chains_together_keep_the_scan_from_settling_and_that_is_a_true_cause() -> None:
    """Two chains, each handing down at every other read of /proc, hand down at every read together: no listing
    settles, /proc stays unavailable while they run (fail closed), and the liveness check counts them as the real
    cause (the soak's seed 424242 found the check calling it false)."""
    m = _machine()
    try:
        m.orphan_appears(1)
        m.fork_chain_maps_file(pick=0, every=2, reuse=False)
        m.fork_chain_maps_file(pick=0, every=2, reuse=False)
        m.faults_stop_and_host_settles()
        assert len(m.world.files) == 1
        m.no_violation()
    finally:
        m.teardown()


def test_actions_of_one_group_interleave_in_orders_the_seed_draws() -> None:
    """Two lanes entered together (disjoint slots, one group) run each in a thread of its own, taking turns at their
    seams in an order the seed draws: across seeds one lane's create falls between the other's create and start,
    and either lane may go first; each seed replays the same order."""
    orders = set()
    for seed in range(8):
        runs = []
        for _ in range(2):
            m = HostMachine()
            m.setup(seed=seed, shape="index", gpu_requests=True, wsl2=False, tmpfs_gib=20.0)
            try:
                m.edit_manifest("split2")
                m.loop_pass()
                m.no_violation()
                assert m.world.sched.switches > 0
                runs.append(tuple((w.kind, w.name.split("-")[1]) for w in m.world.writes))
            finally:
                m.teardown()
        assert runs[0] == runs[1], runs  # replays from its seed
        orders.add(runs[0])
    assert len(orders) >= 3, orders
    assert {o[0][1] for o in orders} == {"omni", "small"}, orders
    assert any([k for k, _ in o] == ["create", "create", "start", "start"] for o in orders), orders


def test_a_wall_clock_stepped_back_a_day_does_not_hold_a_lane_for_that_day() -> None:
    """A lane's enter fails once (10 s of backoff), then the wall clock is stepped back a day while the monotonic
    one runs on: once its fault is gone the lane enters within the bounded passes, not a day later."""
    m = _machine()
    try:
        m.recipe_behaves("omni", "crash")
        m.edit_manifest("split")
        m.loop_pass()
        assert any("-failed-" in c.name for c in m.world.containers.values()), m.world.containers
        m.wall_clock_jumps(-86400.0)
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert any(c.ours and c.state == "running" for c in m.world.containers.values()), m.world.containers
    finally:
        m.teardown()


@pytest.mark.parametrize("podman", [False, True])
def test_a_stop_slower_than_its_timeout_is_killed_and_the_lane_leaves(podman: bool) -> None:
    """An engine that ignores SIGTERM: the leave's stop waits its whole timeout (Podman saying "stopping"
    meanwhile), the engine kills it, and the leave completes; the lane entered beside it on the other card goes on."""
    m = HostMachine()
    m.setup(seed=7, shape="index", gpu_requests=True, wsl2=False, tmpfs_gib=20.0, podman=podman)
    try:
        m.edit_manifest("split2")
        m.loop_pass()
        m.recipe_stops_slowly("small", True)
        m.edit_manifest("split")
        t0 = m.world.now
        result = m.loop.cycle({"resync"})
        m.no_violation()
        assert result.final.converged, result.message
        assert m.world.now - t0 >= 10.0
        (small,) = [c for c in m.world.containers.values() if c.name.startswith("reconciler-small-")] or [None]
        assert small is None or small.exit_code == 137, small
        assert not [f for f in m.world.files.values() if f.maker != "orphan"], m.world.files
    finally:
        m.teardown()


def test_a_container_adopted_by_a_second_terminal_is_ours_from_then_on() -> None:
    """A container with this host's labels and no install id (made by an older version) runs on card 0; a second
    terminal adopts it, and the manifest no longer wants it: the loop stops and removes it, which the checker takes
    as a lane of ours, not a foreign container touched."""
    m = _machine()
    try:
        m.foreign_container(card=0, by="index", kind="legacy", running=True)
        (legacy,) = [c for c in m.world.containers.values() if not c.ours]
        m.second_terminal_adopts(0)
        assert legacy.ours and legacy.id in m.adopted
        m.steps_since_adopt_check = 10
        m.no_violation()
        m.edit_manifest("empty")
        m.loop_pass()
        m.steps_since_adopt_check = 10
        m.no_violation()
        assert legacy.id not in m.world.containers or m.world.containers[legacy.id].state == "exited"
    finally:
        m.teardown()


def test_proc_lost_in_the_middle_of_a_pass_says_why_in_the_pass_result() -> None:
    """A fork chain starts mapping a file while a pass's leaves run: the pass's first plan had /proc, its re-plan
    after the leaves does not. The pass's message names the cause ("processes listed in /proc kept vanishing ...
    handed down by fork"), as a pass that lost the source before its first action does, so the operator (and the liveness check)
    knows why nothing more was done (the soak's seed 772293419 found a bare "source unavailable: proc")."""
    m = HostMachine()
    m.setup(
        seed=786318,
        shape="index",
        gpu_requests=False,
        telemetry="nvml",
        tmpfs_gib=10.0,
        wsl2=False,
        podman=True,
        nvml_hides_identity=True,
    )
    try:
        m.edit_manifest(topology="split2")
        m.cli_apply()
        m.foreign_offload_container(holds_file=False)
        m.fork_chain_maps_file(every=1, pick=0, reuse=True)
        m.container_dies(code=0, pick=0)
        m.container_dies(code=0, pick=0)
        m.faults_stop_and_host_settles()
        m.no_violation()
    finally:
        m.teardown()


def test_a_part_of_the_host_io_the_simulation_does_not_give_stops_the_run_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulation hands the project one ``HostIO``; a part of it left the host's own (here the lanes' POSTs, as
    a part newly added to ``HostIO`` would be until ``sim_io`` gives it) would let a simulated run reach the real
    host: the run stops at once, naming the part."""
    import dataclasses

    import sim.seams as seams
    from reconciler.apply.host_io import REAL_LANES

    made = seams.sim_io

    def leaky(world: World) -> object:
        io = made(world)
        return dataclasses.replace(io, lanes=dataclasses.replace(io.lanes, request=REAL_LANES.request))

    monkeypatch.setattr(seams, "sim_io", leaky)
    with pytest.raises(AssertionError, match=r"HostIO parts left real .*lanes\.request"), installed(World(1)):
        pass


# The host's own reads and writes that ``HostIO`` carries: no module of the apply layer, the loop or the service
# may reach one but through it (a module that did would reach the real host from a simulated run).
_REAL_SEAMS = (
    ("reconciler.apply.http_check", "_http_ok"),
    ("reconciler.apply.http_check", "_http_answer"),
    ("reconciler.apply.ports", "_port_listeners"),
    ("reconciler.apply.groups", "run_in_threads"),
    ("reconciler.apply.vllm_metrics", "read_gauges"),
    ("reconciler.observe.lane_sleep", "ask_sleeping"),
    ("reconciler.observe.lanes", "lane_readings"),
    ("reconciler.observe", "observe"),
    ("reconciler.observe.seams", "REAL_SEAMS"),
    ("reconciler.apply.shm_unlink", "_unlink_agreed"),
    ("reconciler.load.tmpfs", "tmpfs_size"),
    ("reconciler.load.tmpfs", "tmpfs_free"),
    ("reconciler.load.tmpfs", "shm_dir_mount_problem"),
)
# Where they live, and the seam object that binds them (the probes' own requests are the one exception: a probe
# suite is not simulated, and its requests and VRAM samples go to the lane and NVML directly).
_HOMES = {
    "reconciler.apply.host_io",
    "reconciler.apply.shm_guard",
    "reconciler.apply.probes",
    "reconciler.apply.vllm_metrics",
} | {home for home, _ in _REAL_SEAMS}


def test_the_apply_layer_the_loop_and_the_service_reach_the_host_only_through_the_host_io() -> None:
    """Every module of the apply layer, the loop and the service is imported, and none but the seams' own homes
    binds a real seam by name; the steps' clocks and waits go through ``io.clock`` (no ``time.monotonic()``,
    ``time.time()`` or ``time.sleep()`` in the modules whose waits a simulated run passes through)."""
    import importlib
    import pkgutil
    import re
    import sys

    import reconciler.apply
    import reconciler.loop
    import reconciler.service

    for pkg in (reconciler.apply, reconciler.loop, reconciler.service):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(info.name)
    real = {id(getattr(importlib.import_module(mod), name)): f"{mod}.{name}" for mod, name in _REAL_SEAMS}
    bound = sorted(
        f"{name}.{attr} ({real[id(value)]})"
        for name, mod in sys.modules.items()
        if name.startswith(("reconciler.apply", "reconciler.loop", "reconciler.service")) and name not in _HOMES
        for attr, value in vars(mod).items()
        if id(value) in real
    )
    assert bound == []
    clocked = ["applier", "context", "enter", "drain", "sleep", "leave", "ports", "engine_ops", "shm_guard", "groups"]
    root = Path(reconciler.apply.__file__).parent
    uses = [
        f"{path.name}: {m.group(0)}"
        # The loop's fetch timer of a git source too: a simulated run replays its fetches from its seed.
        for path in [
            *(root / f"{n}.py" for n in clocked),
            *(Path(reconciler.loop.__file__).parent / n for n in ("loop.py", "source.py")),
        ]
        for m in re.finditer(r"\btime\.(monotonic|time|sleep)\(", path.read_text())
    ]
    assert uses == []


def test_a_gpu_process_that_forks_its_context_down_blocks_by_the_pid_the_pass_read() -> None:
    """A seed of the soak (2002), shrunk, replayed: a foreign GPU process that a fork chain hands down to a child on
    every few reads of a scan (its pid number reused by the chain) blocks its card, named by the pid NVML listed;
    by the time the pass ended that pid had forked into another. The tool's blocker was true when read: invariant
    (f) now judges a named pid against every pid the pass read, not only those alive after it."""
    m = HostMachine()
    m.setup(
        seed=587493, tmpfs_gib=10.0, gpu_requests=False, nvml_hides_identity=False, podman=False, wsl2=False,
        shape="index", telemetry="nvml",
    )  # fmt: skip
    try:
        m.edit_manifest_named(name="standby-offload", topology="split")
        m.foreign_gpu_process(card=1, hidden=False)
        m.cli_apply()
        m.fork_chain_maps_file(every=2, pick=0, reuse=True)
        m.foreign_gpu_process(card=0, hidden=False)
        for _ in range(3):
            m.cli_apply()
        m.readers_exit(now=True)
        m.process_cannot_be_inspected(excused=True, pick=0)
        m.operator_stops_slowly(grace=5.0, pick=0)
        m.clients_send_requests(n=1, pick=0, seconds=2.0)
        m.fork_chain_maps_file(every=5, pick=0, reuse=False)
        m.foreign_gpu_process(card=0, hidden=False)
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert m.world.pids_read - set(m.world.procs), "the chain forked no read pid away: the case lost its point"
    finally:
        m.teardown()


GIT_EXAMPLES = max(1, EXAMPLES // 40)


def test_runs_that_follow_a_git_source() -> None:
    """The budget's runs that follow a git source (a real repository, committed to between a plan and its approval,
    taken by ``reconciler sync`` and the loop's fetch), run alone: the soak draws them in a small share only, each
    commit and fetch being git's processes."""
    import sim.machine as machine

    machine.run_every_time(HostMachine, machine.GIT_SHARE, GIT_EXAMPLES)


def test_two_switches_at_once_lose_no_update_and_are_audited_as_they_ended() -> None:
    """Two `reconciler switch` calls at once, from split to solo and to exclusive, interleaved at the manifest edit
    lock in the orders the seeds draw: of two that read the same bytes one wins and the other is refused as changed
    (without the check under the lock the second writes over the first: invariant (k)); the file holds the winner's
    topology with every other byte kept, and each is audited as it ended."""
    refused = 0
    for seed in range(12):
        m = _machine()
        try:
            m.edit_manifest_named(name="standby", topology="split")
            m.switches_race(("solo", "exclusive") if seed % 2 else ("exclusive", "solo"), seed)
            m.no_violation()
            refused += any(r.get("action") == "switch" and r.get("outcome") == "refused" for r in _audit(m))
        finally:
            m.teardown()
    assert refused, "no seed made the two switches read the same bytes"


def _audit(m: HostMachine) -> list[dict[str, object]]:
    from reconciler.store.audit import audit_log

    return audit_log("sim").read()


def _git_machine() -> HostMachine:
    m = HostMachine()
    m.setup(seed=7, shape="index", gpu_requests=True, wsl2=False, tmpfs_gib=20.0, git=True)
    return m


def test_a_plan_approved_under_one_commit_never_runs_under_the_next() -> None:
    """With desired state from a git source, a plan is saved (and another shown at a prompt), then a commit that
    changes only the running lane's probe is taken by `reconciler sync`: both approvals are stale, write nothing, and
    say that the git source moved, naming both commits and the probe (invariant (d) across commits)."""
    m = _git_machine()
    try:
        m.edit_manifest("split")
        m.second_terminal_syncs()
        m.loop_pass()
        m.no_violation()
        assert [c.name for c in m.world.containers.values() if c.ours], "the split's lane runs"
        m.recipe_stops_slowly("omni", slow=False)
        m.orphan_appears(1)  # something for the plans to do
        m.plan_saved()
        m.prompt_shown()
        made_under = m._commit_in_use()
        m.source_commit_lands("probe", "omni", "split", synced=True)
        now = m._commit_in_use()
        assert now != made_under
        mark = len(m.world.writes)
        m.saved_plan_applied(0)
        m.prompt_answered()
        m.no_violation()
        assert m.world.writes[mark:] == [], "a stale approval wrote"
        from reconciler.plan.fingerprint import Fingerprint

        session = m._session(m._desired_and_applier()[1], m._desired_and_applier()[2])
        changes = session.changes_since(Fingerprint.from_json(m.saved[0]["fingerprint"]), m.saved[0]["plan"])
        assert any(
            f"the git source moved from {made_under[:7]} to {now[:7]}" in c and "probe smoke changed" in c
            for c in changes
        ), changes
    finally:
        m.teardown()
