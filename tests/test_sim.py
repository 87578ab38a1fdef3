"""The simulated host under the project's real loader, planner, apply layer and loop (tests/sim/): a fixed,
derandomised budget of hypothesis's stateful steps, each followed by the invariant checks. ``make soak`` runs a long
one; every failing sequence it finds becomes a case here or in tests/cases/plan/."""

from __future__ import annotations

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


def _machine(shape: str = "index") -> HostMachine:
    m = HostMachine()
    m.setup(seed=7, shape=shape, gpu_requests=True, wsl2=False, tmpfs_gib=20.0)
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
