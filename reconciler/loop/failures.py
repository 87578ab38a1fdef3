"""A lane's failures and the backoff they earn (``reconciler.loop.backoff``), as the loop counts them: a failed
enter, sleep or wake, and a container of a wanted lane that exited non-zero after it was up (each counted once);
a delay that ran out; a lane that has run long enough since to leave its backoff for good; an edit of the recipe or
its assignment, which starts it afresh. Each change is logged and exported.

Kept by the loop (``reconciler.loop.loop.Loop``), which hands its ``Backoff`` to the planner (``holds()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.model import assignment_key, container_name
from reconciler.plan.actions import ActionKind

if TYPE_CHECKING:
    from reconciler.apply.results import Outcome
    from reconciler.base.clock import Clock
    from reconciler.loop.backoff import Backoff
    from reconciler.loop.log import Log
    from reconciler.loop.metrics import Metrics
    from reconciler.model import DesiredState
    from reconciler.plan.actions import Plan


class LaneFailures:
    """The loop's count of failures per assignment, kept in its ``Backoff``."""

    def __init__(self, backoff: Backoff, *, log: Log, metrics: Metrics, clock: Clock):
        self.backoff = backoff
        self.log = log
        self.metrics = metrics
        self.clock = clock
        self.crashed: set[str] = set()  # ids of crashed containers already counted

    def forget_edited(self, desired: DesiredState) -> None:
        """An edited recipe or assignment starts without a backoff: the operator changed something."""
        recipes = {name: r.content_hash() for name, r in desired.recipes.items()}  # a fallback's entry stays
        for key in self.backoff.forget_changed({a.key: a.recipe_hash for a in desired.assignments}, recipes=recipes):
            self.log("backoff-reset", assignment=key, reason="recipe or assignment edited")
            self.metrics.set_backoff(key.split("@")[0], None)

    def outcome(self, o: Outcome) -> None:
        """A wake that failed is a failed enter (sleeping lanes rule 6), and so is a lane that would not sleep: each
        is entered cold again only after its backoff. A wake refused by rule 1 waits for its card, not a backoff."""
        a = o.action
        failed_lane = a.kind in (ActionKind.ENTER, ActionKind.SLEEP) or (
            a.kind is ActionKind.WAKE and o.result == "failed"
        )
        if failed_lane and a.recipe and o.result in ("failed", "refused"):
            e = self.backoff.failed(a.key, recipe=a.recipe, recipe_hash=a.recipe_hash or "", error=o.detail)
            self.metrics.set_backoff(a.recipe, e.until, failures=e.failures)
            self.log("backoff", assignment=a.key, failures=e.failures, until=round(e.until, 1))

    def crashes(self, desired: DesiredState, plan: Plan) -> bool:
        """A container of a desired assignment that exited non-zero after it was up counts as a failed enter,
        so a container that keeps dying is brought back ever slower. Each container is counted once, however
        many passes plan its leave. True when a new failure was counted."""
        wanted = {d.key for d in desired.assignments}
        planned: set[str] = set()
        counted = False
        for a in plan.actions:
            if a.kind is not ActionKind.LEAVE or not a.exit_code or not a.recipe or not a.container_id:
                continue  # not a container that exited by itself with a non-zero code
            key = assignment_key(a.recipe, a.gpus)
            if key not in wanted:
                continue
            planned.add(a.container_id)
            if a.container_id in self.crashed:
                continue
            e = self.backoff.failed(key, recipe=a.recipe, recipe_hash=a.recipe_hash or "", error=a.reason)
            self.metrics.set_backoff(a.recipe, e.until, failures=e.failures)
            self.log("backoff", assignment=key, failures=e.failures, until=round(e.until, 1), reason=a.reason)
            counted = True
        self.crashed = planned  # only containers still waiting for their leave: bounded
        return counted

    def settle(self, desired: DesiredState, plan: Plan) -> None:
        """Backoff delays that ran out stop counting as held; an assignment that has run long enough since
        leaves backoff for good."""
        now = self.clock.time()
        waiting = {e.recipe for e in self.backoff.entries.values() if e.until > now}
        for recipe in {e.recipe for e in self.backoff.entries.values()} - waiting:
            self.metrics.end_backoff_wait(recipe)
        running = {a.key for a in desired.assignments if container_name(a.recipe, a.slots) in plan.satisfied}
        for key in list(self.backoff.entries):
            e = self.backoff.entries[key]
            if key in running and now - e.until > self.backoff.stable_s:
                self.backoff.succeeded(key)
                self.metrics.set_backoff(e.recipe, None)
                self.log("backoff-cleared", assignment=key)
