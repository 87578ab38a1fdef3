"""The front door in the simulated host (tests/sim/door.py): its invariants (l) (a request is sent only to a lane
that is then healthy and awake and not being drained) and (m) (the demand policy never switches to a topology it saw
blocked, nor within min_dwell_s), each shown to catch a door that breaks it on purpose; the sequences the simulation
found, kept as cases; and a budget of runs of the machine that keeps the door's steps (sim/door_machine.py)."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest

from sim import door_steps
from sim.door_machine import DoorHostMachine
from sim.machine import HostMachine, run_every_time

DOOR_EXAMPLES = int(os.environ.get("SIM_DOOR_EXAMPLES", "40"))


def _machine(door: tuple[Any, ...] = (0.2, 120.0, 16, "standby", 30.0, 900.0)) -> HostMachine:
    """A host whose door is open before the named topologies of ``standby`` (split running, the exclusive lane on
    standby), with the aliases chat (sleepa) and coder (sleepbig) and demand between split and exclusive."""
    m = HostMachine()
    m.setup(seed=7, shape="index", gpu_requests=True, wsl2=False, tmpfs_gib=20.0, telemetry="nvml", door=door)
    return m


def _violations(m: HostMachine, letter: str) -> list[str]:
    return [v for v in m.world.violations if f"({letter})" in v]


def _split_serving(m: HostMachine) -> Any:
    m.loop_pass()
    m.time_passes(5.0)
    m.door_looks()
    door = m.world.door
    assert {r: lane.state for r, lane in door.door.view.lanes.items()} == {
        "sleepa": "serving",
        "sleepb": "serving",
        "sleepbig": "asleep",
    }
    return door


# ---------------------------------------------------------------- (l): nothing sent to a lane not serving


def _switch_with_requests_during_the_drain(m: HostMachine) -> Any:
    """The split serves; the operator switches to the exclusive topology, and during the pass that puts the split's
    lanes to sleep clients keep asking for chat (sleepa's alias) at each of the tool's waits."""
    door = _split_serving(m)
    m.operator_switches("exclusive")
    for during in range(8):
        m.door_clients_ask_during_pass(pick=0, n=1, seconds=1.0, client=during % 3, during=during)
    m.loop_pass()
    return door


def test_requests_during_a_switch_are_held_never_sent_to_the_lane_going_to_sleep() -> None:
    """The drain of sleepa waits until the door has looked since it began; from that look on the door holds chat
    (its lane is leaving), so nothing reaches sleepa while it drains or sleeps, and the held requests go out once
    a switch brings the split back."""
    m = _machine()
    try:
        door = _switch_with_requests_during_the_drain(m)
        assert door.forwarded == 0 or not _violations(m, "l"), m.world.violations
        m.no_violation()
        sleepa = next(c.id for c in m.world.containers.values() if c.labels.get("io.reconciler.recipe") == "sleepa")
        assert sleepa in door.draining, door.draining  # its drain read what the door published
        assert door.door.holds.depth("chat") > 0, door.answers
        m.operator_switches("split")
        m.loop_pass()
        m.door_looks()
        m.time_passes(2.0)
        m.door_looks()
        m.no_violation()
        assert door.answers["200"] >= 1 and not door.door.holds.queues, door.answers
    finally:
        m.teardown()


def test_a_door_that_sends_without_checking_is_caught_by_invariant_l(monkeypatch: pytest.MonkeyPatch) -> None:
    """A door whose admission lets every request through (no look at its lane's state) sends chat to sleepa while
    its drain runs after the door has looked: (l) says so."""
    from reconciler.door.app import Door

    async def admit_all(self: Door, *args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(Door, "_admit", admit_all)
    m = _machine()
    try:
        _switch_with_requests_during_the_drain(m)
        found = _violations(m, "l")
        assert found and "drain began before the door's last look" in " ".join(found), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def test_a_door_that_sends_to_a_sleeping_lane_is_caught_by_invariant_l(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its admission check the door sends coder (the exclusive lane's alias) to sleepbig, asleep on
    standby: (l) names the lane asleep."""
    from reconciler.door.app import Door

    async def admit_all(self: Door, *args: Any, **kwargs: Any) -> None:
        return None

    m = _machine()
    try:
        door = _split_serving(m)
        monkeypatch.setattr(Door, "_admit", admit_all)
        door.ask("coder", 1, 1.0, 0)
        assert any("sleepbig" in v and "asleep" in v for v in _violations(m, "l")), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def test_a_lane_replaced_for_its_edited_recipe_is_held_while_it_drains() -> None:
    """Found by the simulation: the split serves, sleepb's recipe is edited (the loop replaces its lane: drain,
    leave, enter), and a client asks for sim/sleepb at the pass's first wait. The drain waits for a look of the door
    begun after it; that look still finds sleepb's topology running and its lane healthy, so the door sends the
    request to the lane being drained (l)."""
    m = _machine(door=(0.2, 5.0, 4, "standby", 0.0, 20.0))
    try:
        m.cli_apply()
        m.no_violation()
        m.edit_recipe(recipe="sleepb")
        m.door_clients_ask_during_pass(client=0, during=0, n=1, pick=3, seconds=1.0)
        m.cli_apply()
        assert not _violations(m, "l"), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def test_after_the_wall_clock_stepped_back_a_send_before_the_doors_next_look_is_no_violation() -> None:
    """Found by the soak (seed 5101) once the drain counted the door's looks on the monotonic clock: a request sent
    during a switch's drain, before the door's first look since, is one the door could not hold; the judge of (l),
    which compared the drain's start with the door's look on the wall clock, took it for one sent after."""
    m = _machine(door=(1.0, 5.0, 4, "standby", 0.0, 20.0))
    try:
        for _ in range(4):
            m.cli_apply()
            m.door_settles()
        m.wall_clock_jumps(seconds=-86400.0)
        m.door_settles()
        m.operator_switches(topology="exclusive")
        m.door_settles()
        m.door_clients_ask_during_pass(client=0, during=1, n=1, pick=5, seconds=1.0)
        m.door_settles()
        m.cli_apply()
        m.door_settles()
        assert not _violations(m, "l"), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def test_a_drain_after_the_wall_clock_stepped_back_waits_for_a_new_look_of_the_door() -> None:
    """The split serves (the door looking every 5 s); the wall clock is stepped back a day; a switch to exclusive
    puts sleepa to sleep at once, its drain taking the door's look from before the step for one since; chat, asked
    right after, goes to sleepa asleep (l)."""
    m = _machine(door=(5.0, 5.0, 4, "standby", 0.0, 20.0))
    try:
        m.cli_apply()
        m.wall_clock_jumps(-86400.0)
        m.switches_race(("split", "exclusive"), 0)
        m.cli_apply()
        m.door_clients_ask(client=0, n=1, pick=0, seconds=1.0)
        assert not _violations(m, "l"), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def _found_machine() -> DoorHostMachine:
    """The door's machine as the runs below were drawn: seed 0, one GPU index a slot, the door open before the named
    topologies of ``standby`` and looking every 0.2 s."""
    m = DoorHostMachine()
    m.setup(
        seed=0,
        shape="index",
        gpu_requests=False,
        wsl2=False,
        tmpfs_gib=10.0,
        telemetry="nvml",
        podman=False,
        nvml_hides_identity=False,
        git=False,
        door=(0.2, 5.0, 4, "standby", 0.0, 20.0),
    )
    return m


def test_a_lane_that_woke_itself_after_its_drain_serves_again() -> None:
    """Found by the derandomised run of the door's machine: sleepbig was drained and put to sleep, restarted on its
    own during the next apply (vLLM keeps no sleep across a restart: awake, healthy, serving), and the door, which
    saw it serving, sent it coder's request. The judge of (l) took the drain that had ended in the sleep for one
    still running; a restart ends it as a wake does."""
    m = _found_machine()
    try:
        m.door_settles()
        m.cli_apply()
        m.door_settles()
        m.sleeping_lane_restarts(during=0, pick=0)
        m.door_settles()
        m.door_clients_ask(client=0, n=1, pick=1, seconds=1.0)
        m.door_settles()
        sent = m.world.door.forwarded
        m.cli_apply()
        m.door_settles()
        assert m.world.door.forwarded > sent  # the held request went to the lane that woke itself
        assert not _violations(m, "l"), m.world.violations
    finally:
        m.world.violations.clear()
        m.teardown()


def test_a_request_held_while_its_alias_moves_goes_to_the_lane_that_serves_the_name_now() -> None:
    """Found by the door machine's soak (seed 6001): chat, an alias of sleepoff under one manifest, was asked and
    held; the manifest then made chat an alias of another lane, and when the hold ended the door looked sleepoff up in
    a view that no longer had it (a KeyError out of its route). A held request is admitted again for the lane that
    serves its name when the hold ends."""
    m = _found_machine()
    try:
        m.door_settles()
        m.sleeping_lane_restarts(during=0, pick=0)
        m.door_settles()
        m.cli_apply()
        m.door_settles()
        m.edit_recipe(recipe="big")
        m.door_settles()
        m.operator_removes_foreign(pick=0)
        m.door_settles()
        m.port_squatter(listening=True, recipe="big")
        m.door_settles()
        m.sleeping_lane_restarts(during=0, pick=4)
        m.door_settles()
        m.door_clients_ask(client=0, n=1, pick=0, seconds=1.0)
        m.door_settles()
        m.door_manifest(
            demand=False, dwell=0.0, idle=20.0, listed=("split", "exclusive"), name="standby-offload", topology="split"
        )
        m.door_settles()
        m.cli_apply()
        m.door_settles()
        m.door_clients_ask(client=0, n=1, pick=0, seconds=1.0)
        m.door_settles()
        m.door_manifest(
            demand=False, dwell=0.0, idle=20.0, listed=("split", "exclusive"), name="standby", topology="split"
        )
        m.door_settles()
        m.cli_apply()
        m.door_settles()
        assert not _violations(m, "e"), m.world.violations
        assert m.world.door.answers, "the door answered the requests"
    finally:
        m.world.violations.clear()
        m.teardown()


# ---------------------------------------------------------------- (m): the demand policy's switches


def test_a_request_for_the_standby_topology_switches_once_min_dwell_s_has_passed() -> None:
    """coder, asked while the split serves, is held; the door switches the host to exclusive only once the split has
    run min_dwell_s (30 s) as the door saw it, and the loop wakes the exclusive lane for it."""
    m = _machine()
    try:
        door = _split_serving(m)
        door.ask("coder", 1, 1.0, 0)
        assert door.switches == [] and door.door.holds.depth("coder") == 1
        m.time_passes(30.0)
        m.door_looks()
        assert [(a, b) for _, a, b in door.switches] == [("split", "exclusive")]
        m.loop_pass()
        m.door_looks()
        m.time_passes(2.0)
        m.door_looks()
        m.no_violation()
        assert door.answers["200"] == 1, door.answers
    finally:
        m.teardown()


def test_a_wall_clock_step_does_not_shorten_min_dwell_s() -> None:
    """Found by the simulation: the demand policy measured min_dwell_s on the wall clock, so a step of it forward
    (NTP, date -s) let the door switch 9 s after it first saw the split run, within min_dwell_s 30 s (m). It counts
    on the monotonic clock now."""
    m = _machine(door=(0.2, 5.0, 4, "standby", 30.0, 20.0))
    try:
        m.cli_apply()
        m.no_violation()
        m.wall_clock_jumps(30.0)
        m.door_clients_ask(client=0, n=1, pick=1, seconds=1.0)
        m.no_violation()
        assert m.world.door.switches == []
    finally:
        m.teardown()


def test_a_policy_without_its_dwell_is_caught_by_invariant_m(monkeypatch: pytest.MonkeyPatch) -> None:
    """A demand policy that may always switch (min_dwell_s taken as 0) switches for coder at once, and back for
    chat right after: (m) says the switch came within min_dwell_s."""
    from reconciler.door.demand import DemandPolicy

    monkeypatch.setattr(DemandPolicy, "may_switch", lambda self, now: True)
    m = _machine()
    try:
        door = _split_serving(m)
        door.ask("coder", 1, 1.0, 0)
        found = _violations(m, "m")
        assert found and "within demand.min_dwell_s 30 s" in found[0], (door.switches, m.world.violations)
    finally:
        m.world.violations.clear()
        m.teardown()


def _exclusive_seen_blocked(m: HostMachine) -> Any:
    """The exclusive topology blocked while it runs (a foreign container on card 0, where the exclusive lane would
    wake), the door looking then; back to the split by the operator, which serves on card 1 only."""
    door = _split_serving(m)
    m.foreign_container(card=0, by="index", kind="gpu", running=True)
    m.operator_switches("exclusive")
    m.loop_pass()
    m.door_looks()
    assert door.known_blocked.get("exclusive"), (door.known_blocked, m.sink.lines)
    m.operator_switches("split")
    m.loop_pass()
    m.door_looks()
    m.time_passes(60.0)  # beyond min_dwell_s of the split as the door saw it
    m.door_looks()
    return door


def test_a_topology_seen_blocked_is_not_switched_to_and_its_requests_are_refused() -> None:
    m = _machine()
    try:
        door = _exclusive_seen_blocked(m)
        door.ask("coder", 1, 1.0, 0)
        m.no_violation()
        assert door.switches == [] and door.answers["503 blocked"] == 1, (door.switches, door.answers)
    finally:
        m.teardown()


def test_a_policy_that_forgets_a_blocked_topology_is_caught_by_invariant_m(monkeypatch: pytest.MonkeyPatch) -> None:
    """A demand policy that never records what it saw blocked switches to the exclusive topology for coder though
    a look saw it blocked: (m) names the blocker."""
    from reconciler.door.demand import DemandPolicy

    real = DemandPolicy.observe

    def observe_forgetting(self: DemandPolicy, view: Any, now: float) -> None:
        real(self, view, now)
        self.blocked.clear()

    monkeypatch.setattr(DemandPolicy, "observe", observe_forgetting)
    m = _machine()
    try:
        door = _exclusive_seen_blocked(m)
        door.ask("coder", 1, 1.0, 0)
        found = _violations(m, "m")
        assert found and "which a look saw blocked" in found[0], (door.switches, m.world.violations)
    finally:
        m.world.violations.clear()
        m.teardown()


def test_a_topology_seen_blocked_stays_so_when_the_manifest_changes_its_demand() -> None:
    """Found by the simulation: the split was seen blocked (a process outside any container holds card 0's node),
    then a new manifest changed demand: (its min_dwell_s); the door made a new policy, which forgot what it had
    seen blocked, and switched to the split for chat at once (m). What the door saw blocked outlives its policy now."""
    m = _machine(door=(0.2, 5.0, 4, "standby-half", 120.0, 20.0))
    try:
        m.card_node_opened(card=0, where="host")
        m.cli_apply()
        m.loop_pass()
        m.door_looks()
        assert m.world.door.known_blocked.get("split"), m.sink.lines
        m.door_manifest("standby", "exclusive", True, ("split", "exclusive"), 0.0, 20.0)
        m.time_passes(1.0)
        m.door_clients_ask(client=0, n=1, pick=0, seconds=1.0)
        m.no_violation()
        assert m.world.door.switches == [] and m.world.door.answers["503 blocked"] == 1, m.world.door.answers
    finally:
        m.teardown()


def _replay(m: DoorHostMachine, path: Path) -> None:
    """Run a kept sequence (``tests/sim/sequences/*.txt``: one ``step(keyword=literal, ...)`` a line, as hypothesis
    prints them) on the door's machine, the door settling and every invariant checked after each step."""
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        call = ast.parse(line.strip(), mode="eval").body
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args, line
        getattr(m, call.func.id)(**{k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
        if call.func.id != "setup":
            m.door_settles()
        m.no_violation()


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "sequences").glob("door-*.txt")), ids=lambda p: p.stem)
def test_the_kept_sequences_hold_every_invariant(path: Path) -> None:
    m = DoorHostMachine()
    try:
        _replay(m, path)
    finally:
        m.world.violations.clear()
        m.teardown()


# ---------------------------------------------------------------- a budget of the door's machine


def test_the_door_machine_holds_every_invariant() -> None:
    """A derandomised budget of runs of the machine that keeps the door's steps, each opening the door at its start:
    every invariant, (l) and (m) among them, after every step."""
    run_every_time(DoorHostMachine, door_steps.DOOR_SHARE, DOOR_EXAMPLES)
