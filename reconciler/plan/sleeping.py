"""Sleeping lanes (vLLM's sleep mode): which lanes of ours sleep, which wake, and what keeps a wake from starting.

A manifest's ``standby:`` topologies keep their lanes beside the running topology's, asleep: a lane of ours that a
standby topology wants and the running one does not is put to sleep (``sleep``) once healthy, and a sleeping lane
the running topology wants is woken (``wake``) instead of entered cold. docs/design.md, sleeping lanes, rules 1-7:

1. never two awake lanes on one card: a wake starts only when every other lane on its cards is asleep by its own
   answer (``Observed.sleeping``) or goes to sleep or leaves first in the plan, and, with NVML, when the card has the
   memory the lane takes to wake (its awake footprint less what it holds asleep) free beyond its reserve;
2. a sleeping lane still occupies its slots: its processes and memory are its own, nothing foreign may use its
   cards, and a lane entered there is judged with it present.

Pure. Called by ``reconciler.plan.planner`` once per round; the apply layer checks rule 1 again before the call.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from reconciler.base.units import human_bytes
from reconciler.model import DesiredAssignment, DesiredState, assignment_key, container_name
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.causes import BlockerCause, Problem, Problems
from reconciler.plan.claims import is_ours, slot_holders
from reconciler.plan.observed import ContainerView, Observed, ShmView
from reconciler.plan.vram import slot_vram


def rest_and_wake(
    desired: DesiredState,
    observed: Observed,
    satisfied: Sequence[ContainerView],
    standby: Collection[str],
    kept: Collection[str] = (),
) -> tuple[list[ContainerView], list[ContainerView], frozenset[str]]:
    """Of the satisfied lanes: those to put to sleep (a standby lane not asleep by its own answer), those to wake (a
    lane the running topology wants that says it sleeps), and the ids of every standby lane's container (asleep, or
    asleep once its sleep is done): none of them holds its slots against a lane entered or woken there.

    A standby lane in ``kept`` is awake on a card a blocked action wanted: it keeps serving, holding its cards
    (sleeping lanes rule 8), so it is neither put to sleep nor resting."""
    to_sleep: list[ContainerView] = []
    to_wake: list[ContainerView] = []
    resting: set[str] = set()
    for c in satisfied:
        key = assignment_key(c.recipe or "", c.slots)
        asleep = observed.sleeping.get(c.id) is True
        if key in standby:
            if c.id in kept and not asleep:
                continue
            resting.add(c.id)
            if not asleep:
                to_sleep.append(c)
        elif asleep:
            to_wake.append(c)
    return to_sleep, to_wake, frozenset(resting)


def _level(desired: DesiredState, recipe: str | None) -> int:
    """The recipe's sleep level (1 when it has no [sleep], which validate refuses for a lane that sleeps)."""
    r = desired.recipes.get(recipe or "")
    return r.sleep.level if r is not None and r.sleep is not None else 1


def own_files(c: ContainerView, shm: ShmView | None) -> tuple[str, ...]:
    """The offload files only ``c`` holds: what a sleep that is left instead, or a wake that fails, may reclaim. The
    plan lists them on the action (safety rule 13: an action touches only what it lists), as it does for a leave."""
    return tuple(dict.fromkeys(f.path for f in shm.held_only_by(c.names))) if shm is not None else ()


def sleep_action(c: ContainerView, desired: DesiredState, shm: ShmView | None = None) -> Action:
    level = _level(desired, c.recipe)
    return Action(
        kind=ActionKind.SLEEP,
        reason=_sleep_reason(desired, c.recipe or "", c.slots, level),
        recipe=c.recipe,
        gpus=c.slots,
        container=c.name,
        container_id=c.id,
        recipe_hash=c.recipe_hash,
        offload=c.offload,
        paths=own_files(c, shm),
    )


def sleep_after_enter(enter: Action, desired: DesiredState) -> Action:
    """The sleep of a standby lane the plan enters cold: its container is the one the enter makes."""
    level = _level(desired, enter.recipe)
    return Action(
        kind=ActionKind.SLEEP,
        reason=_sleep_reason(desired, enter.recipe or "", enter.gpus, level, first=True),
        recipe=enter.recipe,
        gpus=enter.gpus,
        container=container_name(enter.recipe or "", enter.gpus),
        recipe_hash=enter.recipe_hash,
        offload=enter.offload,
    )


def _sleep_reason(
    desired: DesiredState, recipe: str, slots: tuple[str, ...], level: int, *, first: bool = False
) -> str:
    key = assignment_key(recipe, slots)
    on = [n for n in desired.standby_topologies if any(a.key == key for a in desired.topologies.get(n, ()))]
    when = "once its first enter is healthy, " if first else ""
    return (
        f"{key} is a lane of standby topology {', '.join(on) or '?'} while {desired.topology} runs: {when}drain, "
        f"then sleep (level {level}); a lane that will not sleep is left (stopped) instead"
    )


def wake_action(c: ContainerView, desired: DesiredState, shm: ShmView | None = None) -> Action:
    level = _level(desired, c.recipe)
    how = "wake" if level == 1 else "wake the weights, reload them, wake the KV cache"
    return Action(
        kind=ActionKind.WAKE,
        reason=f"{desired.topology} runs {assignment_key(c.recipe or '', c.slots)} and {c.name} sleeps (level "
        f"{level}): {how}, then its preflight probes; a wake that fails is a failed enter",
        recipe=c.recipe,
        gpus=c.slots,
        container=c.name,
        container_id=c.id,
        recipe_hash=c.recipe_hash,
        offload=c.offload,
        paths=own_files(c, shm),
    )


def as_assignment(c: ContainerView, desired: DesiredState) -> DesiredAssignment:
    r = desired.recipes[c.recipe or ""]
    return DesiredAssignment(c.recipe or "", c.slots, r.content_hash(), r.offload.capacity_bytes)


def wake_memory_problems(
    c: ContainerView, desired: DesiredState, observed: Observed, settled_later: Collection[str]
) -> Problems:
    """Rule 1's memory half: on each card of the lane (but those a sleep or leave earlier in the plan frees, judged
    again before the call), the memory its wake takes must be free beyond the card's reserve; else who holds it."""
    gpus = observed.gpus
    mem = observed.lane_memory.get(c.id)
    if gpus.telemetry != "nvml" or not gpus.reading.ok or mem is None:
        return []
    problems: Problems = []
    for slot in c.slots:
        need = mem.wake_needs(slot)
        view = gpus.slots.get(slot)
        v = slot_vram(desired.host, view)
        if need is None or v is None or slot in settled_later:
            continue
        if v.free_bytes >= need + v.reserve_bytes:
            continue
        others = [p for p in (view.processes if view else ()) if p.container_id != c.id]
        who = holders_text(others, observed)
        problems.append(
            Problem(
                f"waking {c.name} takes {human_bytes(need)} on {slot} (its awake footprint less what it holds "
                f"asleep), but {slot} has {human_bytes(v.free_bytes)} free and keeps {human_bytes(v.reserve_bytes)} "
                f"in reserve: {who}",
                (others and f"pid {others[0].pid}") or f"{human_bytes(v.used_bytes)} in use",
                BlockerCause.MEMORY,
            )
        )
    return problems


def holders_text(processes: Sequence, observed: Observed) -> str:
    """Who holds a card's memory, by pid and container."""
    if not processes:
        return "no other process is listed on it (something NVML does not show holds the memory)"
    names = {c.id: c.name for c in observed.containers}
    parts = []
    for p in processes:
        where = f" in container {names.get(p.container_id, p.container_id[:12])}" if p.container_id else ""
        used = f", {human_bytes(p.used_bytes)}" if p.used_bytes else ""
        parts.append(f"pid {p.pid}{f' ({p.command})' if p.command else ''}{where}{used}")
    return "held by " + "; ".join(parts)


def standby_waits(problems: Problems, awake_ours: Mapping[str, ContainerView]) -> tuple[Problems, list[str]]:
    """A standby lane's enter problems split: those that are awake lanes of ours on its cards (it waits for them to
    sleep, at the next switch: no blocker) and the rest."""
    rest: Problems = []
    waits: list[str] = []
    for p in problems:
        if p.holder in awake_ours:
            waits.append(p.holder)
        else:
            rest.append(p)
    return rest, waits


def awake_beside(desired: DesiredState, observed: Observed, slots: tuple[str, ...]) -> str | None:
    """Rule 1 before a cold start on ``slots``: a sleeping-mode lane of ours there that does not say it sleeps now
    (one that woke itself since the plan, by a restart), named; None when every one there sleeps."""
    host = desired.host.name
    for slot, cs in slot_holders(desired, observed).items():
        if slot not in slots:
            continue
        for x in cs:
            if (
                desired.sleeps(x.recipe)
                and is_ours(x, host, observed.ownership)
                and observed.sleeping.get(x.id) is not True
            ):
                return (
                    f"{x.name} on GPU slot {slot} does not say it sleeps (GET /is_sleeping); two lanes are never "
                    "awake on one card"
                )
    return None
