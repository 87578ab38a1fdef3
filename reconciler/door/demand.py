"""The front door's demand policy (the manifest's ``demand:``, opt-in; docs/design.md, the front door): which switch,
if any, the requests held now ask for, and when the host goes back to ``demand.default``.

Pure: the door's look at the host and the monotonic clock in (never the wall clock: a step of it would shorten or
stretch ``min_dwell_s`` and ``idle_return_s``), a topology name (or a refusal) out; the switch itself is the service's
(``HostService.switch``, the same call as ``reconciler switch``, audited with the door as its caller), made by
``reconciler.door.run``. The rules:

- a request for a model whose lane no running topology has, but another topology of ``demand.topologies`` does,
  asks for that topology (the first so listed), and only while the running topology is one of them (a topology the
  operator chose outside the list is never switched away from by demand);
- a switch is made once the running topology has served ``min_dwell_s`` (counted from when the door first saw it run,
  or from its own last switch): requests alternating between two topologies switch at most once per ``min_dwell_s``;
- never to a topology the door has seen blocked (the loop's last pass blocked while it ran): its held requests are
  refused at once, naming the blocker, until a pass of that topology is seen unblocked;
- after ``idle_return_s`` with nothing in flight, nothing held and no request for the running topology's models, back
  to ``default`` (and, as every switch it makes, not before the running topology has served ``min_dwell_s``).

Called by ``reconciler.door.app`` and ``reconciler.door.run``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from reconciler.model import DemandSpec
from reconciler.service.door_view import DoorView


@dataclass
class DemandPolicy:
    spec: DemandSpec
    topology: str | None = None  # the running topology the door last saw
    since: float = 0.0  # when it first saw it run (or made its own switch)
    blocked: dict[str, str] = field(default_factory=dict)  # topology -> the blocker the door saw while it ran

    def observe(self, view: DoorView, now: float) -> None:
        if view.topology != self.topology:
            self.topology, self.since = view.topology, now
        note_blocked(self.blocked, view)

    def acting(self) -> bool:
        """Demand acts only while the running topology is one of ``demand.topologies``."""
        return self.topology in self.spec.topologies

    def target(self, view: DoorView, recipe: str) -> str | None:
        """The topology a request for ``recipe``'s lane asks for, or None (it runs already, or no listed topology
        other than the running one has it)."""
        lane = view.lanes.get(recipe)
        if not self.acting() or lane is None or self.topology in lane.topologies:
            return None
        return next((t for t in self.spec.topologies if t != self.topology and t in lane.topologies), None)

    def may_switch(self, now: float) -> bool:
        return now - self.since >= self.spec.min_dwell_s

    def switched(self, to: str, now: float) -> None:
        self.topology, self.since = to, now

    def wanted(self, view: DoorView, held: Iterable[str], now: float) -> tuple[str | None, dict[str, str]]:
        """(the topology to switch to now, or None; per held model whose topology is blocked, the blocker)."""
        refuse: dict[str, str] = {}
        choice: str | None = None
        for model in held:
            recipe = view.recipe_of(model)
            to = self.target(view, recipe) if recipe else None
            if to is None:
                continue
            if to in self.blocked:
                refuse[model] = f"topology {to!r} is blocked: {self.blocked[to]}"
            elif choice is None:
                choice = to
        return (choice if choice is not None and self.may_switch(now) else None), refuse

    def idle_return(
        self, view: DoorView, *, in_flight: Mapping[str, int], held: bool, last_request: Mapping[str, float], now: float
    ) -> str | None:
        """``default`` once the running topology has been idle ``idle_return_s``, else None."""
        if not self.acting() or self.topology == self.spec.default or held:
            return None
        if self.spec.default in self.blocked:
            return None
        idle = self.spec.idle_return_s
        if now - self.since < idle or not self.may_switch(now):  # a return is a switch too: never within min_dwell_s
            return None
        mine = {r for r, lane in view.lanes.items() if self.topology in lane.topologies}
        if any(in_flight.get(r, 0) for r in mine):
            return None
        asked = (at for name, at in last_request.items() if view.recipe_of(name) in mine)
        if any(now - at < idle for at in asked):
            return None
        return self.spec.default


def note_blocked(blocked: dict[str, str], view: DoorView) -> None:
    """What one look says of the running topology: blocked (the loop's last pass blocked while it ran: its blocker) or
    not. The door notes it at every look, with demand: or without, and keeps it across a change of demand: (a
    topology it saw blocked is never switched to before a look sees a pass of it unblocked). The pass speaks for the
    topology the loop made it under (``view.pass_topology``), not for the one the manifest names at the look: after a
    switch, a pass of the old topology unblocked clears nothing of the new one. A loop that records no topology has
    its pass taken for the running topology's."""
    topology = view.pass_topology if view.pass_known else view.topology
    if topology is None:
        return
    if view.blocked:
        blocked[topology] = view.blocked
    else:
        blocked.pop(topology, None)
