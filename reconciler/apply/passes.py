"""A converge pass as it goes (``PassRun``) and the pure judgments of its rounds, for ``reconciler.apply.applier``.

What the pass started from and did so far, the prunes of its own kept containers it leaves to the next plan, a
group cut to the approved plan, an action's postcondition against the new plan, the slots' dark time and the
message for sources that did not answer. No I/O: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from reconciler.apply.groups import within
from reconciler.apply.results import Outcome, PassResult, PassVerdict
from reconciler.plan.actions import Action, ActionKind, Plan
from reconciler.plan.observed import Observed


@dataclass
class PassRun:
    """A converge pass as it goes: the plan it started from, the latest observation and plan, what it did so far."""

    first: Plan
    observed: Observed
    current: Plan
    limit: int  # the most actions it runs
    outcomes: list[Outcome] = field(default_factory=list)
    # key -> why: the actions that failed in this pass, held by each later plan of it
    failed: dict[str, str] = field(default_factory=dict)
    # When each slot stopped serving in this pass (its old lane's leave began): an enter on it that succeeds
    # reports the slot's dark time from there.
    dark_since: dict[str, float] = field(default_factory=dict)

    # The plan the operator approved (None in the loop, where every step of each new plan runs).
    approved: Plan | None = None

    def result(self, result: PassVerdict, message: str = "") -> PassResult:
        return PassResult(result, self.first, self.current, self.outcomes, message)

    def kept(self) -> list[Action]:
        """The prunes of the current plan that this pass's own steps made: a container one of its leaves stopped and
        kept for its logs (its lane exited badly, e.g. killed at its stop timeout; or a sleep's lane that would not
        sleep, left instead). The pass's own consequence, not a change of the host: an approved pass leaves them to
        the next plan (docs/design.md, safety rule 13) instead of ending as changed; the loop, approving each of
        its own plans, prunes them at once."""
        if self.approved is None:
            return []
        stopped = {
            o.action.container_id
            for o in self.outcomes
            if o.result == "ok" and o.action.kind in (ActionKind.LEAVE, ActionKind.SLEEP) and o.action.container_id
        }
        return [
            a
            for a in self.current.actions
            if a.kind is ActionKind.PRUNE and a.container_id in stopped and within(self.approved, a) is None
        ]

    def todo(self) -> list[Action]:
        """The current plan's steps this pass still runs (or ends on, where the approved plan does not hold them)."""
        kept = self.kept()
        return [a for a in self.current.actions if a not in kept]

    def with_kept(self, message: str) -> str:
        """``message`` with what this pass kept for its logs and left to the next plan."""
        kept = self.kept()
        if not kept:
            return message
        names = ", ".join(a.container or (a.container_id or "")[:12] for a in kept)
        note = f"kept {names} for its logs (stopped by this pass's leave; the next plan prunes it)"
        return f"{message}; {note}" if message else note


def as_approved(run: PassRun, approved: Plan, group: list[Action]) -> list[Action] | PassResult:
    """The group as far as the approved plan holds it, or the end of the pass when its first step is not in it.

    The rest of the group runs only as far as the approved plan holds it; a step it does not hold comes first in a
    later round and ends the pass there, unseen steps never run."""
    shown = within(approved, group[0])
    if shown is not None:
        return [shown, *(a for a in (within(approved, b) for b in group[1:]) if a is not None)]
    action = group[0]
    unseen = (
        f"the host changed after the plan was shown: the next step ({action.kind.value} "
        f"{action.key}: {action.reason}) was not in it, so it was not done. "
        "Run `reconciler plan` to see the new plan"
    )
    # A step of the shown plan that failed is the news (a failed enter leaves its crash's file to the next plan,
    # whose reclaim is such an unseen step): the pass failed, and says both.
    bad = [o for o in run.outcomes if o.result in ("failed", "refused")]
    if bad:
        return run.result("failed", "; ".join([*(o.detail for o in bad), unseen]))
    return run.result("changed", unseen)


def postcondition(action: Action, outcome: Outcome, current: Plan) -> Outcome:
    """An action that reported ok is done only when the new plan has nothing left for it; else it failed."""
    if outcome.result != "ok" or not _still_wanted(action, current):
        return outcome
    return Outcome(
        action,
        "failed",
        outcome.seconds,
        f"postcondition: after the {action.kind.value}, the plan still wants it ({_brief(current)})",
        outcome.reclaimed_bytes,
        extra=outcome.extra,
    )


def unavailable_message(observed: Observed, names: Iterable[str] = ()) -> str:
    """A pass's message for sources that did not answer: each with its cause (``names``: the plan's, where the
    observation holds none)."""
    down = [f"{s.name} ({s.detail})" for s in observed.unavailable()] or list(names)
    return "source unavailable: " + ", ".join(down)


def with_dark(action: Action, outcome: Outcome, dark_since: dict[str, float], started: float) -> Outcome:
    """Record a leave's or a sleep's slots as dark from its start; give a successful enter or wake its slots' dark
    time."""
    if action.kind in (ActionKind.LEAVE, ActionKind.SLEEP) and outcome.result == "ok":
        for slot in action.gpus:
            dark_since.setdefault(slot, started)
        return outcome
    if action.kind not in (ActionKind.ENTER, ActionKind.WAKE) or outcome.result != "ok":
        return outcome
    end = started + outcome.seconds
    dark = {slot: round(end - dark_since.pop(slot, started), 3) for slot in action.gpus}
    return replace(outcome, extra={**outcome.extra, "dark_s": dark})


def _still_wanted(action: Action, current: Plan) -> bool:
    for a in current.actions:
        if a.kind is not action.kind:
            continue
        if action.kind is ActionKind.LEAVE and a.container_id == action.container_id:
            return True
        if action.kind is ActionKind.ENTER and a.key == action.key:
            return True
        if action.kind is ActionKind.RECLAIM and set(a.paths) & set(action.paths):
            return True
        if action.kind is ActionKind.PRUNE and a.container_id == action.container_id:
            return True
        if action.kind in (ActionKind.SLEEP, ActionKind.WAKE) and a.key == action.key:
            return True
    return False


def _brief(p: Plan) -> str:
    return "; ".join(f"{a.kind.value} {a.key}: {a.reason}" for a in p.actions[:3]) or "nothing"
