"""Sleeping lanes in the simulated host (tests/sim/): vLLM's sleep mode modelled by the world (a lane's GET
/is_sleeping, POST /sleep and /wake_up, the residual it keeps asleep, requests aborted by a sleep, faults on demand),
and docs/design.md's sleeping-lane rules 1-6 judged by the world's own truth after every step or at the call that
would break them. Each case below is a scenario the rule's check in the product code is needed for: with that check
taken out, the case fails on the invariant named."""

from __future__ import annotations

from sim.machine import HostMachine


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
