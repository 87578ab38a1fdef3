"""Sleeping lanes in the simulated host (tests/sim/): vLLM's sleep mode modelled by the world (a lane's GET
/is_sleeping, POST /sleep and /wake_up, the residual it keeps asleep, requests aborted by a sleep, faults on demand),
and docs/design.md's sleeping-lane rules 1-6 judged by the world's own truth after every step or at the call that
would break them. Each case below is a scenario the rule's check in the product code is needed for: with that check
taken out, the case fails on the invariant named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.machine import HostMachine
from sim.world import GIB, LIVE_STATES, World


def _machine(seed: int = 7, **kw: object) -> HostMachine:
    m = HostMachine()
    m.setup(
        seed=seed,
        shape=str(kw.get("shape", "index")),
        gpu_requests=True,
        wsl2=bool(kw.get("wsl2", False)),
        tmpfs_gib=float(kw.get("tmpfs_gib", 20.0)),  # type: ignore[arg-type]
        telemetry=str(kw.get("telemetry", "nvml")),
    )
    return m


def _lanes(m: HostMachine) -> dict[str, tuple[str, str]]:
    """Each container of ours by recipe: (engine state, sleep state by the world's truth)."""
    return {
        c.labels.get("io.reconciler.recipe", ""): (c.state, c.sleep_state)
        for c in m.world.containers.values()
        if c.ours and "-failed-" not in c.name
    }


def _split_running_with_the_exclusive_lane_asleep(m: HostMachine, name: str = "standby") -> None:
    m.edit_manifest_named(name, "split")
    m.loop_pass()
    m.no_violation()
    lanes = _lanes(m)
    assert lanes["sleepbig"] == ("running", "asleep"), lanes
    assert all(v == ("running", "awake") for k, v in lanes.items() if k != "sleepbig"), lanes


def test_a_standby_lane_whose_first_enter_was_interrupted_keeps_its_cards_from_the_running_lane() -> None:
    """The first apply of a host whose exclusive lane runs and whose split is on standby is stopped while the
    split's first lane loads (running, never confirmed healthy, awake). The next apply finishes that lane and puts
    it to sleep before the exclusive lane enters on its card: the planner let the exclusive lane enter beside it
    (the lane's own unfinished container held its finish, and no other enter counted it), two lanes awake on card 0."""
    m = _machine(seed=1756, wsl2=True, tmpfs_gib=10.0)
    try:
        m.edit_manifest_named("standby", "exclusive")
        m.apply_interrupted(after_sleeps=5)
        m.no_violation()
        assert _lanes(m) == {"sleepa": ("running", "awake")}, _lanes(m)
        plan = m.plan_json()
        assert [(a["kind"], a["recipe"]) for a in plan["actions"]][:2] == [("enter", "sleepa"), ("sleep", "sleepa")]
        m.cli_apply()
        m.no_violation()
        assert _lanes(m) == {
            "sleepa": ("running", "asleep"),
            "sleepb": ("running", "asleep"),
            "sleepbig": ("running", "awake"),
        }, _lanes(m)
    finally:
        m.teardown()


def _before_the_wake(m: HostMachine, monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Run ``act(world)`` once, as the exclusive lane's wake begins (after the split's sleeps and their
    postconditions, before the wake's own fresh observation): the world changing between the plan and the wake."""
    import reconciler.apply.sleep as sleep_mod

    real = sleep_mod.SleepSteps.wake_lane
    done: list[bool] = []

    def wake_lane(self: Any, action: Any, observed: Any) -> Any:
        if not done:
            done.append(True)
            act(m.world)
        return real(self, action, observed)

    monkeypatch.setattr(sleep_mod.SleepSteps, "wake_lane", wake_lane)


def test_rule_1_a_lane_that_woke_itself_after_its_sleep_keeps_the_wake_from_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule 1 before the call: the split's lanes are put to sleep for the switch, then one of them restarts and
    wakes itself before the exclusive lane's wake. The wake checks a fresh observation and is refused (that lane
    does not say it sleeps), and the pass puts it back to sleep before it wakes the exclusive lane. Without GPU
    telemetry no process list backs the check up: the lane's own answer is all there is."""
    m = _machine(telemetry="none")
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        restarted = []

        def restart(world: World) -> None:
            c = next(c for c in world.containers.values() if c.labels.get("io.reconciler.recipe") == "sleepa")
            world.restart_lane(c)
            restarted.append(c.name)

        _before_the_wake(m, monkeypatch, restart)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        assert restarted, "the lane never restarted between the sleeps and the wake"
        # Refused, the pass puts that lane back to sleep and the wake runs then.
        kinds = [(o.action.kind.value, o.action.recipe, o.result) for o in result.outcomes]
        assert kinds[2:] == [("wake", "sleepbig", "refused"), ("sleep", "sleepa", "ok"), ("wake", "sleepbig", "ok")]
        assert "does not say it sleeps" in result.outcomes[2].detail, result.outcomes[2].detail
        assert _lanes(m) == {
            "sleepa": ("running", "asleep"),
            "sleepb": ("running", "asleep"),
            "sleepbig": ("running", "awake"),
        }, _lanes(m)
    finally:
        m.teardown()


def test_rule_2_a_process_that_takes_a_sleeping_lanes_card_keeps_the_wake_from_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule 2 before the call: while the split's lanes go to sleep, someone's CUDA process starts on card 0, where
    the exclusive lane sleeps. Its wake is refused naming the pid (never a wake onto a card something foreign
    uses); once the process ends, the wake proceeds."""
    from sim.world import Proc

    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        pids = []

        def trainer(world: World) -> None:
            pids.append(world.add_proc(Proc(world.new_pid(), "python train.py", gpu=world.cards[0].uuid)).pid)

        _before_the_wake(m, monkeypatch, trainer)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        assert pids, "the process never started between the sleeps and the wake"
        (wake,) = [o for o in result.outcomes if o.action.kind.value == "wake"]
        assert wake.result == "refused" and f"pid {pids[0]}" in wake.detail, wake.detail
        m.foreign_gpu_processes_end()
        m.loop_pass()
        m.no_violation()
        assert _lanes(m)["sleepbig"] == ("running", "awake"), _lanes(m)
    finally:
        m.teardown()


def test_rule_3_status_never_calls_a_sleeping_lane_awake() -> None:
    """Rule 3: with the exclusive lane asleep beside the split, status --json says it sleeps (the checker reads
    status after every pass while a lane sleeps by the world's truth), and the plan counts it satisfied, not to
    enter again."""
    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        status = m._status_json()
        (big,) = [c for c in status["containers"] if c["recipe"] == "sleepbig"]
        assert big["sleeping"] is True, big
        assert {c["recipe"]: c["sleeping"] for c in status["containers"]} == {
            "sleepbig": True,
            "sleepa": False,
            "sleepb": False,
        }
        m.loop_pass()
        m.no_violation()
    finally:
        m.teardown()


def test_rule_4_a_sleeping_offload_lanes_file_is_never_reclaimed() -> None:
    """Rule 4: the exclusive lane runs and the split's native-offload lane is entered cold and put to sleep beside
    it (its workers keep its file mapped); an orphan appears, so the passes reclaim: the orphan goes, the sleeping
    lane's file is never tried."""
    m = _machine(tmpfs_gib=10.0)
    try:
        m.edit_manifest_named("standby-offload", "exclusive")
        m.loop_pass()
        m.no_violation()
        assert _lanes(m) == {
            "sleepoff": ("running", "asleep"),
            "sleepb": ("running", "asleep"),
            "sleepbig": ("running", "awake"),
        }, _lanes(m)
        sleeper = next(c for c in m.world.containers.values() if c.labels.get("io.reconciler.recipe") == "sleepoff")
        m.orphan_appears(3)
        for _ in range(2):
            m.loop_pass()
            m.cli_apply()
            m.no_violation()
        makers = {f.maker for f in m.world.files.values()}
        assert makers == {f"container:{sleeper.id}"}, makers
    finally:
        m.teardown()


def test_rule_5_a_lane_whose_drain_times_out_is_never_put_to_sleep() -> None:
    """Rule 5: a request stuck in the split's first lane (longer than its drain's 20 s) when the switch puts it to
    sleep: POST /sleep is never sent with it in flight; the lane is left (stopped) instead, its request unaborted
    by a sleep, and a later pass enters it cold and puts it to sleep."""
    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        lane = next(c for c in m.world.containers.values() if c.labels.get("io.reconciler.recipe") == "sleepa")
        assert m.world.requests_arrive(lane, 1, 100000.0)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        (sleep,) = [o for o in result.outcomes if o.action.kind.value == "sleep" and o.action.recipe == "sleepa"]
        assert sleep.result == "failed" and "left (stopped) instead" in sleep.detail, sleep.detail
        assert lane.state not in LIVE_STATES and lane.aborted == 0
        assert not [k for k, cid, _ in m.world.sleep_calls if cid == lane.id and k == "sleep"]
        # The exclusive lane woke on cards no lane is awake on; the left lane waits, held, for the next switch.
        assert _lanes(m)["sleepbig"] == ("running", "awake"), _lanes(m)
        plan = m.plan_json()
        assert not plan["actions"] and [h["recipe"] for h in plan["held"]] == ["sleepa"], plan
    finally:
        m.teardown()


def test_rule_6_a_wake_that_fails_is_a_failed_enter() -> None:
    """Rule 6, the wake: the exclusive lane's wake answers 500 (half woken). It leaves through the failed-enter
    path (stopped, kept for its logs), and once the fault is gone a later pass enters it cold."""
    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        m.sleep_fault("wake_error", 1.0)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        wake = next(o for o in result.outcomes if o.action.kind.value == "wake")
        assert wake.action.recipe == "sleepbig" and wake.result == "failed", wake.detail
        kept = [c for c in m.world.containers.values() if c.name.startswith("reconciler-sleepbig-")]
        assert [(c.state, "-failed-" in c.name) for c in kept] == [("exited", True)], kept
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert _lanes(m)["sleepbig"] == ("running", "awake"), _lanes(m)
    finally:
        m.teardown()


def test_rule_6_a_lane_that_will_not_sleep_is_left() -> None:
    """Rule 6, the sleep: the split's lanes answer their POST /sleep and never say they sleep. Each is left
    (stopped) once sleep.timeout_s has passed, and the exclusive lane wakes on cards no lane is awake on."""
    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        m.sleep_fault("sleep_never", 1.0)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        sleeps = [o for o in result.outcomes if o.action.kind.value == "sleep"]
        assert [o.result for o in sleeps] == ["failed", "failed"], [o.detail for o in sleeps]
        assert all("would not sleep" in o.detail for o in sleeps)
        split = [c for c in m.world.containers.values() if c.labels.get("io.reconciler.recipe") in ("sleepa", "sleepb")]
        assert all(c.state not in LIVE_STATES for c in split), split
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert _lanes(m)["sleepbig"] == ("running", "awake"), _lanes(m)
    finally:
        m.teardown()


def test_rule_2_memory_taken_while_a_lane_sleeps_keeps_its_wake_from_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 2, its memory: while the split's lanes go to sleep, something NVML lists no process for takes 70 GiB
    of card 1, where the exclusive lane sleeps and keeps its residual. The wake takes its awake footprint less that
    residual, which card 1 no longer has free beyond its reserve: refused before the call (never an out-of-memory
    wake), and woken once the memory is given back."""
    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)

        def take(world: World) -> None:
            world.cards[1].hidden_used = 70 * GIB

        _before_the_wake(m, monkeypatch, take)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        wake = next(o for o in result.outcomes if o.action.kind.value == "wake")
        assert wake.result == "refused" and "its awake footprint less what it holds asleep" in wake.detail, wake.detail
        m.foreign_gpu_processes_end()
        m.loop_pass()
        m.no_violation()
        assert _lanes(m)["sleepbig"] == ("running", "awake"), _lanes(m)
    finally:
        m.teardown()


def test_under_wsl2_a_sleeping_lanes_own_pids_do_not_keep_its_wake_from_starting() -> None:
    """WSL2: NVML lists each lane's worker by a pid of another namespace, which /proc cannot tie to its container.
    The planner takes such a pid on a card a lane of ours claims for that lane's and plans the wake; the wake's own
    check right before the call took it for a foreign process and refused every time, so the switch never ended
    (the soak's seed 556 found every pass failing on it). A process of this /proc on the card still refuses it."""
    from sim.world import Proc

    m = _machine(wsl2=True)
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        m.operator_switches("exclusive")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        assert result.final.converged, [o.detail for o in result.outcomes]
        assert _lanes(m)["sleepbig"] == ("running", "awake"), _lanes(m)
        m.operator_switches("split")
        pid = m.world.add_proc(Proc(m.world.new_pid(), "python train.py", gpu=m.world.cards[1].uuid)).pid
        m.loop_pass()
        m.no_violation()
        assert _lanes(m)["sleepb"] == ("running", "asleep"), _lanes(m)
        assert f"pid {pid}" in json.dumps(m.plan_json()["blockers"])
    finally:
        m.teardown()


def test_a_lane_kept_on_a_blocked_card_beside_a_sleeping_lane_keeps_the_other_card_too() -> None:
    """The split runs with the exclusive lane asleep beside it; the manifest becomes a plain split of other
    recipes and card 0 goes missing. The sleeping TP=2 lane is kept (its card 0 is blocked), so it holds card 1; the
    split's lane there is kept in turn, and the enter of the new lane on card 1 was planned beside both once its
    only causes were kept lanes (the soak's seed 20261202 found it started beside an awake lane). It waits now."""
    m = _machine(seed=0, tmpfs_gib=10.0)
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        m.edit_manifest("split2")
        m.card_presence(card=0, present=False)
        m.cli_apply()
        m.no_violation()
        assert "omni" not in _lanes(m), _lanes(m)
        m.card_presence(card=0, present=True)
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert _lanes(m) == {"omni": ("running", "awake"), "small": ("running", "awake")}, _lanes(m)
    finally:
        m.teardown()


def test_a_cold_enter_beside_a_lane_that_woke_itself_waits_for_it_to_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 1 before a start: the split's first lane is replaced by another (a new recipe on card 0) while the
    exclusive lane sleeps there; that lane restarts and wakes itself after the plan, before the new lane's create.
    The enter checks a fresh observation and is refused (it was started beside the awake lane: another seed of the
    simulation); the pass puts the lane back to sleep and the enter runs then."""
    import reconciler.apply.enter as enter_mod

    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        real = enter_mod.EnterSteps.enter
        done: list[bool] = []

        def enter(self: Any, action: Any, observed: Any) -> Any:
            if not done and action.recipe == "sleepoff":
                done.append(True)
                big = next(c for c in m.world.containers.values() if c.labels.get("io.reconciler.recipe") == "sleepbig")
                m.world.restart_lane(big)
            return real(self, action, observed)

        monkeypatch.setattr(enter_mod.EnterSteps, "enter", enter)
        m.edit_manifest_named("standby-offload", "split")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        assert done
        refused = [o for o in result.outcomes if o.action.recipe == "sleepoff" and o.result == "refused"]
        assert refused and "does not say it sleeps" in refused[0].detail, [o.detail for o in result.outcomes]
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert _lanes(m) == {
            "sleepbig": ("running", "asleep"),
            "sleepoff": ("running", "awake"),
            "sleepb": ("running", "awake"),
        }, _lanes(m)
    finally:
        m.teardown()


def test_rule_1_a_lane_that_wakes_itself_while_an_enter_beside_it_is_made_is_caught_before_the_start() -> None:
    """A seed of the soak (1319111639), shrunk, replayed: under WSL2 the split enters beside the exclusive lane asleep
    on its two cards, and that lane restarts (and wakes itself) while the split's enters are under way. No lane is
    ever started beside it once it said it is awake (it may be started in the instant between its last answer that
    it sleeps and its restart: no tool can close that, and the simulation lets it pass only so); the next pass puts
    the lane back to sleep. The start's own check is held by the case below."""
    m = HostMachine()
    m.setup(seed=0, shape="index", gpu_requests=False, wsl2=True, tmpfs_gib=10.0, telemetry="nvml")
    try:
        m.edit_manifest_named(name="standby", topology="split")
        m.no_violation()
        m.other_program_writes_pattern_file(gib=1, held=False, now=False)
        m.cli_apply()
        m.no_violation()
        assert _lanes(m)["sleepbig"] == ("running", "asleep"), _lanes(m)
        m.sleeping_lane_restarts(during=1, pick=0)
        m.cli_apply()
        m.no_violation()
        m.cli_apply()
        m.no_violation()
        assert _lanes(m)["sleepbig"] == ("running", "asleep"), _lanes(m)
    finally:
        m.teardown()


def test_rule_1_a_lane_that_wakes_itself_between_an_enters_create_and_its_start_keeps_it_from_starting() -> None:
    """Rule 1 at the start itself: the split's first lane is replaced by another (a new recipe on card 0) while the
    exclusive lane sleeps there; that lane restarts (and wakes itself) right after the new lane's container is
    created, before its start. The enter checks once more with its container made, is refused (the container, never
    started, removed), and the pass after puts the lane back to sleep and enters the new lane then. Without that
    last check the new lane starts beside the awake one: the simulation's invariant (a)."""
    m = _machine()
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        world = m.world
        real_create = world.create
        done: list[str] = []

        def create(*args: Any, **kw: Any) -> Any:
            c = real_create(*args, **kw)
            if not done and c.ours and "sleepoff" in c.name:
                done.append(c.name)
                big = next(x for x in world.containers.values() if x.labels.get("io.reconciler.recipe") == "sleepbig")
                world.restart_lane(big)
            return c

        world.create = create  # type: ignore[method-assign]
        m.edit_manifest_named("standby-offload", "split")
        result = m.loop.cycle({"resync"})
        m.no_violation()
        assert done, "the new lane was never created"
        refused = [o for o in result.outcomes if o.action.recipe == "sleepoff" and o.result == "refused"]
        assert refused and "does not say it sleeps" in refused[0].detail, [o.detail for o in result.outcomes]
        assert done[0] not in {c.name for c in world.containers.values() if c.state != "removed"}, "not removed"
        m.faults_stop_and_host_settles()
        m.no_violation()
        assert _lanes(m) == {
            "sleepbig": ("running", "asleep"),
            "sleepoff": ("running", "awake"),
            "sleepb": ("running", "awake"),
        }, _lanes(m)
    finally:
        m.teardown()


def test_a_fallback_on_a_squatted_port_is_found_by_the_plan_not_by_a_failed_start() -> None:
    """A seed of the 16-core soak (4241403824), shrunk, replayed: the loop's fallback (a lane of the last converged
    topology) was entered without its port or image looked up, so a stale server on its port failed the enter that
    the plan could have named (invariant (h)). The observation now looks up the fallback's recipes too."""
    m = HostMachine()
    m.setup(seed=0, shape="index", gpu_requests=False, wsl2=False, tmpfs_gib=10.0, telemetry="nvml")
    try:
        m.foreign_offload_container(holds_file=False)
        m.edit_manifest_named(name="standby-half", topology="split")
        m.cli_apply()
        m.no_violation()
        m.nvml_down(down=True)
        m.operator_stops_slowly(grace=5.0, pick=7)
        m.container_dies(code=0, pick=3)
        m.edit_manifest_named(name="standby", topology="exclusive")
        m.port_squatter(listening=True, recipe="omni")
        m.cli_apply()
        m.no_violation()
        m.cli_apply()
        m.no_violation()
        m.faults_stop_and_host_settles()
        m.no_violation()
    finally:
        m.teardown()


def test_a_sleep_left_instead_reclaims_only_the_files_its_plan_listed() -> None:
    """A seed of the 16-core soak (3245819255), shrunk, replayed: under `reconciler apply`, the split's offload lane
    would not sleep (its /sleep failed) and was left instead, and its offload file was unlinked though the approved
    plan listed no file (invariant (d), safety rule 13). A sleep now lists the files only its lane holds, as a leave
    does, and the leave instead reclaims no other."""
    m = HostMachine()
    m.setup(
        seed=3957, gpu_requests=False, shape="index", wsl2=False, tmpfs_gib=10.0, telemetry="nvml",
        nvml_hides_identity=True, podman=True,
    )  # fmt: skip
    try:
        m.sleep_fault(fault="sleep_error", p=0.0)
        m.edit_manifest_named(name="standby-offload", topology="split")
        m.cli_apply()
        m.no_violation()
        m.edit_manifest_named(name="standby-offload", topology="exclusive")
        m.foreign_container(by="index", card=0, idle=False, kind="foreign", running=False)
        m.sleep_fault(fault="sleep_error", p=0.3)
        m.cli_apply()
        m.no_violation()
        m.faults_stop_and_host_settles()
        m.no_violation()
    finally:
        m.teardown()


def test_a_lane_that_would_not_sleep_is_stopped_though_the_engines_list_fails_meanwhile() -> None:
    """A seed of the 16-core soak (1005), shrunk, replayed: the lane's /sleep failed, and the observation its leave
    instead was made on came while the engine's list did not answer; the leave found no container in that list,
    said it was "already gone", and the lane kept running awake (sleeping lanes rule 6). A list that did not answer
    now never makes a container gone: the leave instead stands on the view the sleep was planned on, and a leave
    given such a list refuses rather than skip the stop."""
    m = HostMachine()
    m.setup(
        seed=0, shape="index", gpu_requests=False, wsl2=False, tmpfs_gib=10.0, telemetry="nvml", podman=False,
        nvml_hides_identity=False,
    )  # fmt: skip
    try:
        m.sleep_fault(fault="sleep_error", p=1.0)
        m.engine_fault(lost=False, method="list", p=0.3)
        m.other_program_writes_pattern_file(gib=1, held=False, now=True)
        for _ in range(10):
            m.cli_apply()
            m.no_violation()
        m.edit_manifest_named(name="standby", topology="exclusive")
        m.cli_apply()
        m.no_violation()
    finally:
        m.teardown()


def test_rule_8_a_blocked_wake_darkens_no_serving_lane() -> None:
    """The split serves with the exclusive lane asleep, and a foreign container takes card 0. A switch to the
    exclusive topology planned both split lanes' sleeps and showed the wake blocked; apply put both to sleep, both
    cards dark with nothing to bring them back (invariant (j)). Now neither sleeps: they keep serving, the plan says
    so, and once the foreign container goes the switch runs."""
    m = _machine(seed=3)
    try:
        _split_running_with_the_exclusive_lane_asleep(m)
        m.foreign_container(card=0, by="index", kind="plain", running=True)
        m.operator_switches("exclusive")
        m.cli_apply()
        m.no_violation()
        m.loop_pass()
        m.no_violation()
        lanes = _lanes(m)
        assert lanes["sleepbig"] == ("running", "asleep"), lanes
        assert all(v == ("running", "awake") for k, v in lanes.items() if k != "sleepbig"), lanes
        plan = m.plan_json()
        assert plan["actions"] == [] and plan["blocked"], plan
        assert len(plan["kept_serving"]) == 2, plan
        m.operator_removes_foreign(pick=0)
        m.loop_pass()
        m.no_violation()
        lanes = _lanes(m)
        assert lanes["sleepbig"] == ("running", "awake"), lanes
        assert all(v == ("running", "asleep") for k, v in lanes.items() if k != "sleepbig"), lanes
    finally:
        m.teardown()
