"""Pure: whether an edit made while an enter waits for its health leaves that enter's lane unwanted.

An enter waits up to its recipe's ``health.start_timeout_s`` (minutes for a real model). When the desired state
changes meanwhile so that the lane being entered is no longer wanted (its recipe edited, its assignment gone, another
topology switched to), waiting on is only dark time: the loop abandons the enter at its next health poll and plans
again (docs/design.md, "The loop"). Asked by the loop's check (``reconciler.loop``) with the desired state its pass
started from and the one the files hold now; an enter the pass's desired state did not want (a fallback's) is never
judged here.
"""

from __future__ import annotations

from reconciler.model import DesiredAssignment, DesiredState
from reconciler.plan import spec
from reconciler.plan.actions import Action, ActionKind


def wanted_lanes(desired: DesiredState) -> dict[str, DesiredAssignment]:
    """The lanes ``desired`` wants a container for, by key: the running topology's and the standby ones."""
    return {a.key: a for a in (*desired.assignments, *desired.standby)}


def _parts(desired: DesiredState, a: DesiredAssignment) -> dict[str, str]:
    recipe = desired.recipes[a.recipe]
    return spec.part_hashes(desired.host, recipe, a.slots, secret_digests=desired.secret_digests)


def superseded_by(action: Action, before: DesiredState, now: DesiredState) -> str | None:
    """Why the enter ``action`` (planned from ``before``) is no longer wanted by ``now``, in words; None while it is
    still wanted: the same lane (recipe on the same slots) rendered to the same container, whatever else changed."""
    if action.kind is not ActionKind.ENTER or now is before:
        return None
    was = wanted_lanes(before).get(action.key)
    if was is None or was.recipe not in before.recipes:
        return None  # not a lane of the desired state (a fallback): never judged here
    is_now = wanted_lanes(now).get(action.key)
    if is_now is None or is_now.recipe not in now.recipes:
        where = f"topology {now.topology}" if now.topology else "the manifest"
        return f"{action.key} is no longer wanted: {where} does not assign it any more"
    changed = spec.changed_parts(spec.encode_parts(_parts(before, was)), _parts(now, is_now))
    if not changed:
        return None
    return (
        f"recipe {was.recipe} was edited ({', '.join(changed)} changed): the lane being entered is not the one wanted"
    )
