"""The enters of one planning round: each wanted assignment no container satisfies is blocked (with every cause
said), held (its recipe in backoff), skipped (a fallback that cannot be placed), or entered, in the manifest's
order, each entered offload file taking its room on the tmpfs.

Pure. Called by ``reconciler.plan.planner`` once per round, after the round's leaves and reclaim are known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reconciler.base.units import human_bytes
from reconciler.model import DesiredAssignment, DesiredState, container_name
from reconciler.plan.actions import Action, ActionKind, Blocker, Fallback, Held
from reconciler.plan.causes import BlockerCause, Problem, Problems
from reconciler.plan.claims import describe_container
from reconciler.plan.enter_checks import enter_problems
from reconciler.plan.observed import ContainerView, Observed, ShmView
from reconciler.plan.slot_problems import identity_problems, slot_problems


@dataclass(frozen=True)
class EnterRound:
    """What the planner's round knows when it places its enters."""

    desired: DesiredState
    observed: Observed
    hold: Mapping[str, str]  # assignment key -> why its enter is postponed
    kept_lanes: frozenset[str]  # running lanes of ours that stay: a blocker is on their slots
    blocked_before: frozenset[str]  # assignments the round before found blocked
    by_assignment: Mapping[tuple[str | None, tuple[str, ...]], list[ContainerView]]  # our containers per lane
    by_fallback: Mapping[str, Fallback]  # fallback lanes by assignment key
    covered: frozenset[str]  # held assignments a fallback stands on
    finishing: Mapping[str, ContainerView]  # assignment key -> its container left waiting for health
    leaving: set[str | None]  # ids of the containers planned to leave
    kept_ids: set[str]  # satisfied, finishing and kept containers
    holders: Mapping[str, list[ContainerView]]  # slot -> active containers holding it (not leaving or finishing)
    by_id: Mapping[str, ContainerView]
    unsound: Mapping[str, str]  # slot -> why it cannot be used at all
    fallback_ids: frozenset[str]  # ids of the containers of fallback lanes


def place_enters(
    r: EnterRound, enters: Sequence[DesiredAssignment], room: int
) -> tuple[list[Blocker], list[Held], list[Action]]:
    """The blockers, held enters and enter actions of ``enters``; ``room`` is the tmpfs bytes free once the planned
    leaves and reclaim are done."""
    blockers: list[Blocker] = []
    held: list[Held] = []
    actions: list[Action] = []
    for d in enters:
        if d.key in r.covered and d.key in r.hold:
            # Its slots serve the fallback meanwhile: held, not blocked by the fallback; anything else that holds
            # its slots is still said.
            problems = _covered_problems(r, d)
            if not problems:
                held.append(Held(recipe=d.recipe, gpus=d.slots, reason=r.hold[d.key]))
            blockers.extend(blockers_of(d, problems))
            continue
        problems = _problems(r, d, room)
        if problems and d.key in r.by_fallback:
            continue  # a fallback that cannot be placed is simply not used: the held lane stays held, not blocked
        if problems:
            blockers.extend(blockers_of(d, problems))
            continue
        if d.key in r.hold:
            held.append(Held(recipe=d.recipe, gpus=d.slots, reason=r.hold[d.key]))
            continue
        room -= d.offload_bytes
        actions.append(_enter(r, d))
    return blockers, held, actions


def blockers_of(d: DesiredAssignment, problems: Problems) -> list[Blocker]:
    """The blockers of ``d``, one for each of its problems, each with its cause."""
    return [Blocker(d.recipe, d.slots, p.reason, p.holder, cause=p.cause) for p in problems]


def _covered_problems(r: EnterRound, d: DesiredAssignment) -> Problems:
    """What holds the slots of a held assignment a fallback serves, the fallback's own containers aside."""
    own_holders = {s: [c for c in cs if c.id not in r.fallback_ids] for s, cs in r.holders.items()}
    problems = slot_problems(d, r.observed, own_holders, r.by_id, r.leaving, r.kept_ids | r.fallback_ids, r.desired)
    return problems + identity_problems(d, r.desired, r.observed, r.unsound, r.leaving)


def _problems(r: EnterRound, d: DesiredAssignment, room: int) -> Problems:
    """Every cause that keeps ``d`` from entering now: its slots, its name, its knowable failures, its offload."""
    # A lane of ours kept on a slot because a blocker is there: no cause of the enter the round before found
    # blocked (its own causes are said), and for any other enter a cause said as such.
    d_holders = {s: [c for c in cs if c.id not in r.kept_lanes] for s, cs in r.holders.items()}
    problems = slot_problems(d, r.observed, d_holders, r.by_id, r.leaving, r.kept_ids, r.desired)
    if d.key not in r.blocked_before:
        problems += kept_lane_problems(r, d)
    problems += identity_problems(d, r.desired, r.observed, r.unsound, r.leaving)
    if d.key in r.blocked_before and not problems:
        # Blocked the round before only by lanes kept since (a sleeping lane kept for a blocked card holds its other
        # card, and the lane beside it there is kept in turn): they still hold its slots, so it still waits.
        problems += kept_lane_problems(r, d)
    if d.key not in r.finishing and d.key not in r.hold:
        # The lane's own containers, those leaving first, and lanes kept on its slots may hold its ports.
        own_ids = {c.id for c in r.by_assignment.get((d.recipe, d.slots), [])} | {
            c.id for s in d.slots for c in r.holders.get(s, ()) if c.id in r.kept_lanes
        }
        problems += enter_problems(d, r.desired, r.observed, own=r.leaving | own_ids)
    if d.offload_bytes and d.key not in r.finishing:  # a container being finished has its offload file already
        problems += _offload_problems(r, d, room)
    return problems


def kept_lane_problems(r: EnterRound, d: DesiredAssignment) -> Problems:
    return [
        Problem(
            f"{describe_container(c)} holds GPU slot {s} and keeps serving it: the lane that would replace it there "
            "is blocked",
            c.name,
            BlockerCause.HELD,
        )
        for s in d.slots
        for c in r.holders.get(s, ())
        if c.id in r.kept_lanes
    ]


def _offload_problems(r: EnterRound, d: DesiredAssignment, room: int) -> Problems:
    """Whether the tmpfs has room for the offload file of ``d``; shm.reserve_gib stays free beyond every offload
    file: judged here, not only against the tmpfs size at load."""
    shm = r.observed.shm
    if not (shm.proc.ok and shm.docker.ok):
        return [Problem("offload files cannot be inspected: " + _sources(shm), "", BlockerCause.UNSEEN)]
    reserve = r.desired.host.shm.reserve_bytes
    if d.offload_bytes + reserve <= room:
        return []
    return [
        Problem(
            f"tmpfs {shm.dir} would have {human_bytes(room)} free after planned leaves and reclaim; "
            f"recipe {d.recipe} needs {human_bytes(d.offload_bytes)} for its offload file"
            + (f" and shm.reserve_gib keeps {human_bytes(reserve)} free beyond it" if reserve else ""),
            "tmpfs",
            BlockerCause.TMPFS,
        )
    ]


def _enter(r: EnterRound, d: DesiredAssignment) -> Action:
    fin = r.finishing.get(d.key)
    if fin is not None:
        reason = (
            f"finish {fin.name}: it was left waiting for its health check (an apply stopped meanwhile); "
            "wait for it again rather than restart its model load"
        )
    elif d.key in r.by_fallback:
        reason = r.by_fallback[d.key].text
    else:
        reason = _enter_reason(d, r.by_assignment.get((d.recipe, d.slots), []))
    return Action(
        kind=ActionKind.ENTER,
        reason=reason,
        container_id=fin.id if fin is not None else None,
        recipe=d.recipe,
        gpus=d.slots,
        container=container_name(d.recipe, d.slots),
        recipe_hash=d.recipe_hash,
        bytes=d.offload_bytes,
        offload=r.desired.recipes[d.recipe].offload.enabled,
    )


def _enter_reason(d: DesiredAssignment, mine: list[ContainerView]) -> str:
    if any(c.active for c in mine):
        return f"recreate {d.recipe} on {','.join(d.slots)} once the container it replaces has left"
    return f"manifest gives {','.join(d.slots)} to {d.recipe}; no container of it is running"


def _sources(shm: ShmView) -> str:
    return ", ".join(f"{s.name} {s.render()}" for s in (shm.proc, shm.docker) if not s.ok)
