"""One observation, assembled once (docs/design.md, "The host's I/O seams"): ``reconciler.observe.observe`` reads each
source through its seam and builds through the one constructor, ``reconciler.plan.observed.observation``; the
simulation gives the seams and keeps no copy of ``observe``, and the planner's fixtures build through the same
constructor. So a fact added to the observation in one place reaches the planner, the approval fingerprint and the
simulation, and a keyword the observation does not take is refused on the simulated host as on the real one (a
copy that swallowed unknown keywords let a soak stay green while testing nothing new)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from planner_fixtures import make_desired, make_observed

import reconciler.plan.observed as observed_module
from reconciler.plan.fingerprint import fingerprint, input_parts
from reconciler.plan.observed import Observed
from reconciler.plan.planner import plan
from sim.machine import HostMachine
from sim.seams import real_parts_left

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Later(Observed):
    """The observation with one fact more, as a later release would add it: its containers that run, by name."""

    running: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "running", tuple(sorted(c.name for c in self.containers if c.state == "running")))


@pytest.fixture
def machine() -> Iterator[HostMachine]:
    m = HostMachine()
    m.setup(seed=11, shape="index", gpu_requests=True, wsl2=False, tmpfs_gib=20.0)
    try:
        yield m
    finally:
        m.teardown()


def _planned(m: HostMachine) -> tuple[Any, Any, Any]:
    """The desired state, the observation the planner is given and its plan, as ``reconciler plan`` makes them on
    the simulated host."""
    from reconciler.apply.applier import Applier
    from reconciler.load.desired import load_desired

    desired = load_desired(str(m.root), tmpfs=m.world.io.tmpfs)
    observed, p = Applier(desired, connect=False, io=m.world.io).plan_now()
    return desired, observed, p


def test_a_fact_added_in_one_place_reaches_the_planner_the_fingerprint_and_the_simulation(
    machine: HostMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(observed_module, "Observed", Later)  # the one place: the observation's own fields
    desired, before, _ = _planned(machine)
    assert isinstance(before, Later) and before.running == ()
    machine.edit_manifest("split")
    machine.loop_pass()
    machine.no_violation()
    # The simulation: what the world runs, as the planner is given it.
    truth = tuple(sorted(c.name for c in machine.world.containers.values() if c.state == "running"))
    desired, after, p = _planned(machine)
    assert isinstance(after, Later) and after.running == truth and truth, (after, truth)
    assert not p.actions, p
    # The fingerprint: the fact is a part of it, by its name, and its change is said.
    assert input_parts(desired, after, {})["running"] == [f'"{name}"' for name in truth]
    changes = fingerprint({}, desired, after, {}).changes_since(fingerprint({}, desired, before, {}))
    assert [c for c in changes if c.startswith("running:")] == [f'running: now "{name}"' for name in truth]
    # The planner's fixtures build through the same constructor: their observations carry it too, and plan.
    case = {"recipes": {"omni": {}}, "manifest": [{"omni": ["dark-compute-b"]}], "observed": {}}
    fixture = make_observed(case, make_desired(case))
    assert isinstance(fixture, Later) and fixture.running == ()
    assert plan(make_desired(case), fixture).actions


def test_a_keyword_the_observation_does_not_take_is_refused_on_the_simulated_host_too(machine: HostMachine) -> None:
    """The simulated host runs the project's ``observe``: a caller that passes it something new finds it refused
    there as on the host, not dropped."""
    from reconciler.load.desired import load_desired

    desired = load_desired(str(machine.root), tmpfs=machine.world.io.tmpfs)
    with pytest.raises(TypeError, match="quiet_hours"):
        machine.world.io.observe(desired.host, quiet_hours=("22-06",))


def test_each_source_of_the_observation_is_the_worlds(machine: HostMachine) -> None:
    """Every seam of the observation the simulation hands in is its own; one left the host's own (as a seam newly
    added would be until the simulation gives it) is named before a run starts."""
    from reconciler.observe.seams import REAL_SEAMS, ObserveSeams

    io = machine.world.io
    assert real_parts_left(io) == []
    for seam in dataclasses.fields(ObserveSeams):
        leaky = dataclasses.replace(
            io, sources=dataclasses.replace(io.sources, **{seam.name: getattr(REAL_SEAMS, seam.name)})
        )
        assert real_parts_left(leaky) == [f"sources.{seam.name}"], seam.name


def _calls(tree: ast.AST) -> list[int]:
    """The lines in ``tree`` that call ``Observed(...)`` by that name."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Observed"
    ]


def _made(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}" for line in _calls(ast.parse(path.read_text(), str(path)))]


def test_only_the_one_constructor_makes_an_observation() -> None:
    """Nothing in the package, its tests or its examples builds an ``Observed`` but ``observation`` itself."""
    made = [
        hit for d in ("reconciler", "tests", "examples") for p in sorted((ROOT / d).rglob("*.py")) for hit in _made(p)
    ]
    home = ROOT / "reconciler" / "plan" / "observed.py"
    tree = ast.parse(home.read_text())
    constructor = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "observation")
    assert made == [f"reconciler/plan/observed.py:{line}" for line in _calls(constructor)], made
