"""What outlives one pass of the loop, logged once when it begins and once when it ends, never every pass: a source
down or back (``source-down``, ``source-up``), a slot below its free-VRAM reserve or back above it
(``gpu-below-reserve``, ``gpu-reserve-ok``), a fallback lane in force or ended (``fallback``, ``fallback-ended``).

Kept by the loop (``reconciler.loop.loop.Loop``), which reads back what the last pass left: the sources down for
``/healthz`` and its state, the fallbacks for its state and ``/metrics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.plan.vram import vram_by_slot

if TYPE_CHECKING:
    from reconciler.loop.log import Log
    from reconciler.loop.metrics import Metrics
    from reconciler.model import DesiredState
    from reconciler.plan.actions import Plan
    from reconciler.plan.observed import Observed


class PassChanges:
    """The conditions the last pass left, each compared with the pass before it."""

    def __init__(self, *, log: Log, metrics: Metrics):
        self.log = log
        self.metrics = metrics
        self.down: dict[str, str] = {}  # sources the last pass could not read, with why
        self.down_codes: dict[str, str] = {}  # the same sources, each with its short cause: slow, down or error
        self.fallbacks: set[str] = set()  # fallback lanes in force after the last pass
        self.fallback_json: list[dict[str, Any]] = []
        self.below: set[str] = set()  # slots below their free-VRAM reserve in the last pass

    def sources(self, observed: Observed) -> None:
        """Log each source that went down or came back since the last pass."""
        down = {name: src.detail or "unavailable" for name, src in observed.readings.items() if not src.ok}
        for name, detail in sorted(down.items()):
            if name not in self.down:
                self.log(
                    "source-down",
                    source=name,
                    detail=detail,
                    action="nothing that needs it is changed; looking again when it answers",
                )
        for name in sorted(set(self.down) - set(down)):
            self.log("source-up", source=name)
        self.down = down
        self.down_codes = {
            name: src.cause if src.cause in ("slow", "down") else "error"
            for name, src in observed.readings.items()
            if not src.ok
        }

    def reserve(self, desired: DesiredState, observed: Observed) -> None:
        """Log each slot that went below its free-VRAM reserve or came back above it; a pass that could not read the
        cards changes nothing."""
        if not observed.gpus.reading.ok:
            return
        figures = vram_by_slot(desired.host, observed.gpus)
        below = {slot for slot, v in figures.items() if v.below_reserve}
        owner = desired.slot_owner()
        for slot in sorted(below - self.below):
            lane = owner.get(slot)
            self.log(
                "gpu-below-reserve",
                slot=slot,
                detail=figures[slot].describe(),
                policy=desired.reserve_policy(lane.recipe if lane else None),
            )
        for slot in sorted(self.below - below):
            if slot in figures:
                self.log("gpu-reserve-ok", slot=slot, detail=figures[slot].describe())
        self.below = below

    def fallbacks_after(self, final: Plan) -> None:
        """Export the fallbacks in force after a pass; log each one that starts or ends."""
        now = {f"{f.recipe}@{'+'.join(f.gpus)}": f for f in final.fallbacks}
        for key in sorted(set(now) - self.fallbacks):
            self.log("fallback", assignment=key, detail=now[key].text)
        for key in sorted(self.fallbacks - set(now)):
            self.log("fallback-ended", assignment=key)
        self.fallbacks = set(now)
        self.fallback_json = [f.to_json() for f in final.fallbacks]
        self.metrics.set_fallbacks(final.fallbacks)
