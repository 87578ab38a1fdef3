"""Which actions of a plan run together and how: pure choices over a plan's actions, and the threads.

``concurrent_group`` picks the first action and those after it that may run at once; ``within`` says how far an
approved plan holds a step; ``run_in_threads`` runs a group, each action in a thread of its own (the host's own
``HostIO.run_group``; the simulation's interleaves them). Called by ``reconciler.apply.applier``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from reconciler.apply.results import Outcome
from reconciler.base.errors import ReconcilerError
from reconciler.plan.actions import Action, ActionKind, Plan

# Actions that may run together: those that take lanes out (a leave, a sleep), those that bring lanes in (an enter,
# a wake), prunes; on disjoint slots each is judged on its own cards (a wake's rule 1 on its own). A reclaim is alone.
_PHASE = {
    ActionKind.LEAVE: "out",
    ActionKind.SLEEP: "out",
    ActionKind.ENTER: "in",
    ActionKind.WAKE: "in",
    ActionKind.PRUNE: "prune",
}


def concurrent_group(actions: tuple[Action, ...]) -> list[Action]:
    """Pure: the plan's first action and the actions right after it that may run at the same time: of the same phase
    (leaves and sleeps, then enters and wakes; a reclaim always alone) and on slots none of the others uses."""
    first = actions[0]
    group = [first]
    if first.kind is ActionKind.RECLAIM:
        return group
    used = set(first.gpus)
    for a in actions[1:]:
        if _PHASE.get(a.kind) != _PHASE[first.kind] or not a.gpus or used & set(a.gpus):
            break
        group.append(a)
        used |= set(a.gpus)
    return group


class GroupNotStarted(ReconcilerError):
    """A thread of a group could not be started: raised by ``run_in_threads`` once every thread it did start has
    ended. ``results``: each call's outcome in the calls' order, None for those that never ran."""

    code = "group_not_started"

    def __init__(self, message: str, results: list[Outcome | None]):
        super().__init__(message)
        self.results = results


def run_in_threads(calls: list[Callable[[], Outcome]]) -> list[Outcome]:
    """Run each call in a thread of its own; their results in the calls' order. A thread that cannot be started
    (the process at its limit) starts no later one, and the group still ends only when each started thread has
    ended (a pass never leaves an action running behind it): then GroupNotStarted says which."""
    results: list[Outcome | None] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), name=f"action-{i}", daemon=True) for i in range(len(calls))]
    started: list[threading.Thread] = []
    failure = ""
    for i, t in enumerate(threads):
        try:
            t.start()
        except RuntimeError as exc:
            failure = f"action {i + 1} of {len(calls)} could not be given a thread ({type(exc).__name__}: {exc})"
            break
        started.append(t)
    for t in started:
        t.join()
    if failure:
        raise GroupNotStarted(failure, results)
    return [r for r in results if r is not None]


def within(approved: Plan, action: Action) -> Action | None:
    """Pure: ``action`` as far as the approved plan holds it, or None when it holds no such step.

    A leave, a prune and a wake must name the same container, an enter the same assignment and recipe hash, a sleep
    the same assignment (and its container, unless the approved plan entered it first); a reclaim, a leave, a wake
    and a sleep keep only the paths the approved plan listed (the operator saw those, and no others).
    """
    for a in approved.actions:
        if a.kind is not action.kind:
            continue
        if action.kind is ActionKind.LEAVE and a.container_id == action.container_id:
            paths = tuple(p for p in action.paths if p in set(a.paths))
            return replace(action, paths=paths) if paths != action.paths else action
        if action.kind is ActionKind.ENTER and a.key == action.key and a.recipe_hash == action.recipe_hash:
            return action
        if action.kind is ActionKind.RECLAIM:
            paths = tuple(p for p in action.paths if p in set(a.paths))
            if paths:
                return replace(action, paths=paths) if paths != action.paths else action
        if action.kind is ActionKind.PRUNE and a.container_id == action.container_id:
            return action
        # A sleep shown for a lane the plan was to enter first names no container yet: the one entered for it. A
        # wake and a sleep keep only the paths the approved plan listed (a failed wake, or a sleep left instead,
        # may reclaim those).
        if (action.kind is ActionKind.WAKE and a.container_id == action.container_id) or (
            action.kind is ActionKind.SLEEP and a.key == action.key and a.container_id in (None, action.container_id)
        ):
            paths = tuple(p for p in action.paths if p in set(a.paths))
            return replace(action, paths=paths) if paths != action.paths else action
    return None
