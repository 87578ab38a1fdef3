"""The front door's steps, drawn among the simulated host's (``machine.HostMachine`` mixes them in; docs/design.md,
the simulation): the door opened (at the start of a share of the runs, or as a step), a manifest of named topologies
with its aliases and demand, clients asking for served names, aliases and unknown models (now, or during the next
pass), a client going away, and a look of the door followed by its demand policy's turn (a demand switch, an idle
return). The door itself, and the invariants (l) and (m) it is judged by, are ``sim.door``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from sim.door import SimDoor
from sim.world import World

# The aliases each named manifest of the machine (machine.NAMED) gains with the door: a name -> the recipe it asks for.
ALIASES = {
    "standby": {"chat": "sleepa", "coder": "sleepbig"},
    "standby-offload": {"chat": "sleepoff", "coder": "sleepbig"},
    "standby-half": {"chat": "omni", "coder": "sleepbig"},
}


# One run in DOOR_SHARE + 1 starts with the door open before a manifest of named topologies with aliases and demand:
# (a run that draws ``door_opens`` later rarely reaches a demand switch within its steps). -1: every run.
DOOR_SHARE = [int(os.environ.get("SIM_DOOR_SHARE", "3"))]
# The door at the start: (look every, hold_s, max_queue, the named manifest, min_dwell_s, idle_return_s).
DOOR_START = st.tuples(
    st.sampled_from([0.2, 1.0, 5.0]),
    st.sampled_from([5.0, 30.0, 120.0]),
    st.sampled_from([4, 16, 256]),
    st.sampled_from(sorted(ALIASES)),
    st.sampled_from([0.0, 30.0, 120.0]),
    st.sampled_from([20.0, 60.0, 900.0]),
)


def door_starts() -> st.SearchStrategy[Any]:
    """The door at the start of a run, or None: ``DOOR_SHARE`` read at each draw (a test sets it for its own runs)."""
    return st.tuples(st.integers(0, 3), DOOR_START).map(
        lambda t: t[1] if DOOR_SHARE[0] < 0 or t[0] * (DOOR_SHARE[0] + 1) < 4 else None
    )


def _door(self: Any) -> SimDoor | None:
    return self.world.door if self.world is not None else None


class DoorSteps:
    """The door's steps, drawn among the machine's (``machine.HostMachine`` mixes them in)."""

    world: World | None
    root: Path
    tree: Path
    source: Any
    topology: str

    @precondition(lambda self: self.world is not None and self.world.door is None)
    @rule(
        every=st.sampled_from([0.2, 1.0, 5.0]),
        hold_s=st.sampled_from([5.0, 30.0, 120.0]),
        max_queue=st.sampled_from([4, 16, 256]),
    )
    def door_opens(self, every: float, hold_s: float, max_queue: int) -> None:
        """``reconciler door`` starts before the lanes: it looks every ``every`` seconds (``LOOK_S`` is 0.2)."""
        assert self.world is not None

        def switched(to: str) -> None:
            if ":" in self.topology:
                self.topology = f"{self.topology.split(':')[0]}:{to}"

        SimDoor(self.world, self.root, every=every, hold_s=hold_s, max_queue=max_queue, on_switch=switched)

    @precondition(lambda self: self.world is not None)
    @rule(
        name=st.sampled_from(sorted(ALIASES)),
        topology=st.sampled_from(["split", "exclusive"]),
        demand=st.booleans(),
        listed=st.sampled_from([("split", "exclusive"), ("exclusive", "split", "solo")]),
        dwell=st.sampled_from([0.0, 30.0, 120.0]),
        idle=st.sampled_from([20.0, 60.0, 900.0]),
    )
    def door_manifest(
        self, name: str, topology: str, demand: bool, listed: tuple[str, ...], dwell: float, idle: float
    ) -> None:
        """A manifest of named topologies with ``aliases:`` for the door and, where the host has no git source (it
        refuses ``demand:`` there), the door's ``demand:``."""
        self._write_named(name, topology)  # type: ignore[attr-defined]
        path = self.tree / "manifests" / "sim.yaml"
        text = "aliases:\n" + "".join(f"  {a}: {r}\n" for a, r in ALIASES[name].items())
        if demand and self.source is None:
            text += (
                f"demand: {{topologies: [{', '.join(listed)}], default: split, idle_return_s: {idle:g}, "
                f"min_dwell_s: {dwell:g}}}\n"
            )
        path.write_text(path.read_text() + text)
        self._publish(f"named topologies {name} with aliases, {topology} running")  # type: ignore[attr-defined]

    @precondition(lambda self: _door(self) is not None)
    @rule(
        pick=st.integers(0, 15),
        n=st.integers(1, 4),
        seconds=st.sampled_from([1.0, 8.0, 100000.0]),
        client=st.integers(0, 2),
    )
    def door_clients_ask(self, pick: int, n: int, seconds: float, client: int) -> None:
        """Clients ask the door for a served name, an alias or an unknown model, each answered in ``seconds``
        (100000: stuck, longer than any drain)."""
        door = _door(self)
        assert door is not None
        door.ask(door.pick(pick), n, seconds, client)

    @precondition(lambda self: _door(self) is not None)
    @rule(
        pick=st.integers(0, 15),
        n=st.integers(1, 4),
        seconds=st.sampled_from([1.0, 8.0, 100000.0]),
        client=st.integers(0, 2),
        during=st.integers(0, 6),
    )
    def door_clients_ask_during_pass(self, pick: int, n: int, seconds: float, client: int, during: int) -> None:
        """Clients ask the door during the next pass, after ``during`` of the tool's waits (a drain among them)."""
        door = _door(self)
        assert door is not None
        door.later.append([during, (door.pick(pick), n, seconds, client)])

    @precondition(lambda self: _door(self) is not None)
    @rule()
    def door_looks(self) -> None:
        """A look of the door and the demand policy's turn after it (a demand switch, or the idle return)."""
        door = _door(self)
        assert door is not None
        door.look(demand=True)

    @precondition(lambda self: _door(self) is not None)
    @rule(pick=st.integers(0, 7))
    def door_client_leaves(self, pick: int) -> None:
        door = _door(self)
        assert door is not None
        door.leave(pick)

    @invariant()
    def door_settles(self) -> None:
        door = _door(self)
        if door is not None:
            door.step_ended()

    def _open_door(self, start: tuple[Any, ...] | None) -> None:
        """The door drawn at the start (``door_starts``): open, before a manifest of named topologies with its aliases
        and (without a git source) its demand."""
        if start is None:
            return
        every, hold_s, max_queue, name, dwell, idle = start
        self.door_opens(every, hold_s, max_queue)
        self.door_manifest(name, "split", True, ("split", "exclusive"), dwell, idle)

    def _door_saw_pass(self, loop: Any) -> None:
        door = _door(self)
        if door is not None and loop is not None:
            desired = getattr(loop, "desired", None)
            door.pass_ended(desired.topology if desired is not None else None, dict(loop.last_pass))

    def _close_door(self) -> None:
        door = _door(self)
        if door is not None:
            door.close()
