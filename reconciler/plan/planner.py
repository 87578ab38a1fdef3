"""The pure planner: ``plan(desired, observed) -> Plan``.

Called by every command that decides (``plan``, ``apply``, ``status``, the loop). It reads plain values and
returns frozen actions in a safe order: leaves first (they free GPU slots and offload files), then a reclaim
of orphan offload files, then enters. It never observes and never acts; ``reconciler.apply`` executes the very
same Plan object. Nothing here imports Docker, NVML or metrics (an import contract test keeps it so).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from reconciler.base.units import human_bytes
from reconciler.model import DesiredAssignment, DesiredState, assignment_key
from reconciler.plan import spec, upgrades
from reconciler.plan.actions import Action, ActionKind, Blocker, Fallback, Held, Plan
from reconciler.plan.claims import claimed_slots, is_ours, slot_holders, slot_ids
from reconciler.plan.enters import EnterRound, blockers_of, kept_lane_problems, place_enters
from reconciler.plan.observed import LABEL_SPEC_PARTS, NEVER_STARTED_STATES, ContainerView, Observed, Ownership, ShmView
from reconciler.plan.sleeping import (
    as_assignment,
    rest_and_wake,
    sleep_action,
    sleep_after_enter,
    wake_action,
    wake_memory_problems,
)
from reconciler.plan.slot_problems import slot_problems, unsound_slots


def plan(
    desired: DesiredState,
    observed: Observed,
    *,
    hold: Mapping[str, str] | None = None,
    last_good: Sequence[tuple[str, tuple[str, ...]]] = (),
    next_attempt: Mapping[str, float] | None = None,
) -> Plan:
    """Decide what to do. ``hold`` maps assignment keys (recipe@slots) to a reason to postpone their enter.

    ``last_good`` is the last converged topology as (recipe, slots) pairs, and ``next_attempt`` the seconds until
    each held assignment's next attempt: while an assignment is held, the lanes of ``last_good`` that fit within
    its slots (and nobody else's) serve them meanwhile, unless the manifest says ``fallback: false``.

    Blockers are scoped to their slots: what touches no blocked slot is planned and runs; a running lane of ours on
    a blocked slot neither leaves nor sleeps (it keeps serving while what would replace it cannot enter or wake:
    sleeping lanes rule 8). Keeping it may hold another enter's slot in turn, so the plan is made again
    with those lanes kept until nothing more is kept.
    """
    keep: frozenset[str] = frozenset()
    blocked_before: frozenset[str] = frozenset()
    while True:
        p = _plan_once(
            desired,
            observed,
            hold=hold,
            last_good=last_good,
            next_attempt=next_attempt,
            kept_lanes=keep,
            blocked_before=blocked_before,
        )
        blocked_slots = {s for b in p.blockers for s in b.gpus}
        active = {c.id for c in observed.containers if c.active}
        more = {
            a.container_id
            for a in p.actions
            if a.container_id in active
            and (
                (a.kind is ActionKind.LEAVE and set(_leave_slots(a, desired, observed)) & blocked_slots)
                or (a.kind is ActionKind.SLEEP and set(a.gpus) & blocked_slots)
            )
        }
        if not more - keep:
            by_id = {c.id: c.name for c in observed.containers}
            return replace(p, kept_serving=tuple(sorted(by_id[k] for k in keep if k in by_id)))
        keep = keep | {c for c in more if c is not None}
        blocked_before = blocked_before | {assignment_key(b.recipe, b.gpus) for b in p.blockers}


def _leave_slots(a: Action, desired: DesiredState, observed: Observed) -> tuple[str, ...]:
    """The slots a leave frees: its container's slot label and whatever its GPU ids claim."""
    c = next((x for x in observed.containers if x.id == a.container_id), None)
    if c is None:
        return a.gpus
    ids = slot_ids(desired.host, observed)
    return tuple(dict.fromkeys((*a.gpus, *claimed_slots(c, ids, tuple(desired.host.gpus), host=desired.host.name))))


def _plan_once(
    desired: DesiredState,
    observed: Observed,
    *,
    hold: Mapping[str, str] | None,
    last_good: Sequence[tuple[str, tuple[str, ...]]],
    next_attempt: Mapping[str, float] | None,
    kept_lanes: frozenset[str],
    blocked_before: frozenset[str],
) -> Plan:
    """One round of ``plan``: ``kept_lanes`` are running lanes of ours that stay (a blocker is on their slots), and
    ``blocked_before`` the assignments the round before found blocked (a lane kept for them is no cause of theirs)."""
    hold = hold or {}
    host = desired.host.name
    unavailable = tuple(s.name for s in observed.unavailable())
    if not observed.docker.ok:
        # Without Docker nothing about containers is known: no action can be justified.
        return Plan(host=host, unavailable=unavailable)

    own = observed.ownership
    ours = [c for c in observed.containers if is_ours(c, host, own) and not (c.preserved and not c.active)]
    fallbacks = _fallbacks_in_force(desired, ours, hold, last_good, next_attempt or {})
    held_on = {s: d for d in desired.assignments if d.key in hold for s in d.slots}
    by_fallback = {assignment_key(f.recipe, f.gpus): f for f in fallbacks}
    wanted = (*desired.assignments, *(_as_assignment(desired, f) for f in fallbacks))
    by_assignment: dict[tuple[str | None, tuple[str, ...]], list[ContainerView]] = {}
    for c in ours:
        if not c.preserved:
            by_assignment.setdefault((c.recipe, c.slots), []).append(c)

    # The standby topologies' lanes that nothing running wants: kept beside them, asleep (plan.sleeping).
    wanted_keys = {d.key for d in wanted}
    standby = tuple(d for d in desired.standby if d.key not in wanted_keys)
    standby_keys = frozenset(d.key for d in standby)
    lanes = _match_lanes(desired, observed, (*wanted, *standby), by_assignment, kept_lanes)
    lanes.leaves.extend(_unwanted_leaves(desired, ours, lanes.claimed, kept_lanes))
    leaves = _with_paths(lanes.leaves, observed)
    leaving = {a.container_id for a in leaves}
    finishing_ids = {c.id for c in lanes.finishing.values()}
    # A standby lane's container left waiting for health (an interrupted first enter) is awake: it holds its cards
    # against every other lane until its finish and its sleep are placed before them (sleeping lanes rule 1).
    standby_finishing = {c.id for k, c in lanes.finishing.items() if k in standby_keys}
    to_sleep, to_wake, resting = rest_and_wake(desired, observed, lanes.satisfied, standby_keys, kept_lanes)
    reclaim = _reclaim(observed.shm)
    round_ = EnterRound(
        desired=desired,
        observed=observed,
        hold=hold,
        kept_lanes=kept_lanes,
        blocked_before=blocked_before,
        by_assignment=by_assignment,
        by_fallback=by_fallback,
        # A fallback covers every held lane it stands on (a TP=2 fallback may span two held lanes).
        covered=frozenset(held_on[s].key for f in fallbacks for s in f.gpus if s in held_on),
        finishing=lanes.finishing,
        leaving=leaving,
        kept_ids={c.id for c in lanes.satisfied} | finishing_ids | set(kept_lanes),
        # A standby lane's container sleeps (or will, before anything enters or wakes beside it): no holder.
        holders=slot_holders(desired, observed, skip=leaving | (finishing_ids - standby_finishing) | resting),
        by_id={c.id: c for c in observed.containers},
        unsound=unsound_slots(desired, observed),
        fallback_ids=frozenset(c.id for c in ours if assignment_key(c.recipe or "", c.slots) in by_fallback),
    )
    room = _offload_room(observed, leaving, reclaim)
    s_blockers, s_held, s_enters = _standby_enters(
        round_, [d for d in lanes.enters if d.key in standby_keys], room, resting, to_wake
    )
    room -= sum(a.bytes for a in s_enters if a.kind is ActionKind.ENTER)
    finished = {a.container_id for a in s_enters if a.kind is ActionKind.ENTER} & standby_finishing
    if finished:
        skip = leaving | (finishing_ids - standby_finishing) | finished | resting
        round_ = replace(round_, holders=slot_holders(desired, observed, skip=skip))
    blockers, held, enter_actions = place_enters(round_, [d for d in lanes.enters if d.key not in standby_keys], room)
    wakes, w_blockers = _wakes(round_, to_wake, to_sleep, leaves)

    actions: list[Action] = [*leaves, *(sleep_action(c, desired, observed.shm) for c in to_sleep)]
    if reclaim is not None:
        actions.append(reclaim)
    actions.extend(s_enters)
    actions.extend(wakes)
    actions.extend(enter_actions)
    blockers = [*s_blockers, *w_blockers, *blockers]
    held = [*s_held, *held]
    actions.extend(_prunes(desired, observed, wanted_keys | standby_keys))
    placed = {a.key for a in enter_actions} | {assignment_key(c.recipe or "", c.slots) for c in lanes.satisfied}
    return Plan(
        host=host,
        actions=tuple(actions),
        blockers=tuple(blockers),
        held=tuple(held),
        unavailable=unavailable,
        satisfied=tuple(c.name for c in lanes.satisfied),
        # Only the fallbacks that run or are entered in this plan (one that cannot be placed is not in force).
        fallbacks=tuple(f for f in fallbacks if assignment_key(f.recipe, f.gpus) in placed),
    )


def _standby_enters(
    r: EnterRound,
    enters: Sequence[DesiredAssignment],
    room: int,
    resting: frozenset[str],
    to_wake: Sequence[ContainerView],
) -> tuple[list[Blocker], list[Held], list[Action]]:
    """The cold enters of standby lanes absent from the host, each followed by its sleep. One enters only onto cards
    no lane is awake on (a lane about to wake still sleeps then; one being finished is awake): while an awake lane of
    ours is there, it waits, held, for a switch to put that lane to sleep (a lane is never darkened for a standby)."""
    if not enters:
        return [], [], []
    waking = {c.id for c in to_wake}
    # A standby lane's own container left waiting for health is finished by its enter, never its holder.
    own = {c.id for k, c in r.finishing.items() if k in {d.key for d in enters}}
    holders = slot_holders(r.desired, r.observed, skip=r.leaving | resting | waking | own)
    awake = {c.name: c for cs in holders.values() for c in cs if c.id in r.kept_ids}
    blockers, held, placed = place_enters(replace(r, holders=holders), enters, room)
    by_key: dict[str, list[Blocker]] = {}
    for b in blockers:
        by_key.setdefault(assignment_key(b.recipe, b.gpus), []).append(b)
    out_blockers: list[Blocker] = []
    for key, bs in by_key.items():
        waits = [b for b in bs if b.holder in awake]
        if len(waits) == len(bs):
            b = bs[0]
            names = ", ".join(dict.fromkeys(w.holder for w in waits))
            held.append(
                Held(
                    recipe=b.recipe,
                    gpus=b.gpus,
                    reason=f"standby lane {key} is entered once its cards hold no awake lane ({names} runs there): "
                    "at the next switch of topology",
                )
            )
        else:
            out_blockers.extend(b for b in bs if b not in waits)
    actions: list[Action] = []
    for a in placed:
        actions.extend((a, sleep_after_enter(a, r.desired)))
    return out_blockers, held, actions


def _wakes(
    r: EnterRound, to_wake: Sequence[ContainerView], to_sleep: Sequence[ContainerView], leaves: Sequence[Action]
) -> tuple[list[Action], list[Blocker]]:
    """The wakes of the sleeping lanes the running topology wants, and the blockers of those that cannot wake: what
    holds their cards (rule 1: only lanes asleep, or put to sleep or leaving first, may be there) and the memory a
    wake takes."""
    settled_later = {s for c in to_sleep for s in c.slots} | {s for a in leaves for s in a.gpus}
    wakes: list[Action] = []
    blockers: list[Blocker] = []
    for c in to_wake:
        d = as_assignment(c, r.desired)
        # A lane kept serving because this wake (or another action on its cards) is blocked is said as such, and is
        # no cause of the wake the round before found blocked (its own causes are said), as for an enter.
        holders = {s: [x for x in cs if x.id != c.id and x.id not in r.kept_lanes] for s, cs in r.holders.items()}
        problems = slot_problems(d, r.observed, holders, r.by_id, r.leaving, r.kept_ids, r.desired)
        problems += wake_memory_problems(c, r.desired, r.observed, settled_later)
        if d.key not in r.blocked_before or not problems:
            problems += kept_lane_problems(r, d)
        if problems:
            blockers.extend(blockers_of(d, problems))
        else:
            wakes.append(wake_action(c, r.desired, r.observed.shm))
    return wakes, blockers


def _fallbacks_in_force(
    desired: DesiredState,
    ours: Sequence[ContainerView],
    hold: Mapping[str, str],
    last_good: Sequence[tuple[str, tuple[str, ...]]],
    next_attempt: Mapping[str, float],
) -> tuple[Fallback, ...]:
    """The fallbacks this round considers: none under ``fallback: false``, and none for a held lane any container
    of which runs (a start whose engine answer was lost, one left waiting for health): the fallback would share
    its cards."""
    if not desired.fallback:
        return ()
    running_held = {assignment_key(c.recipe or "", c.slots) for c in ours if c.active and not c.preserved} & set(hold)
    return _fallbacks(desired, {k: v for k, v in hold.items() if k not in running_held}, last_good, next_attempt)


@dataclass
class _Lanes:
    """What one round makes of the containers of ours against the wanted assignments."""

    leaves: list[Action] = field(default_factory=list)
    enters: list[DesiredAssignment] = field(default_factory=list)
    satisfied: list[ContainerView] = field(default_factory=list)
    finishing: dict[str, ContainerView] = field(default_factory=dict)  # key -> its container left waiting for health
    claimed: set[str] = field(default_factory=set)  # ids of the containers of a wanted assignment


def _match_lanes(
    desired: DesiredState,
    observed: Observed,
    wanted: Sequence[DesiredAssignment],
    by_assignment: Mapping[tuple[str | None, tuple[str, ...]], list[ContainerView]],
    kept_lanes: frozenset[str],
) -> _Lanes:
    """Each wanted assignment against its containers of ours: the one that satisfies it, or an enter (finishing
    the wait of one left waiting for health, if any); every other container of it leaves, unless kept."""
    lanes = _Lanes()
    for d in wanted:
        mine = by_assignment.get((d.recipe, d.slots), [])
        lanes.claimed.update(c.id for c in mine)
        parts = spec.part_hashes(
            desired.host, desired.recipes[d.recipe], d.slots, secret_digests=desired.secret_digests
        )
        diffs = {c.id: _matches(c, d, parts, desired) for c in mine}
        # Satisfied only once it has passed its health check: one left waiting by an interrupted apply never did.
        good = [c for c in mine if c.state == "running" and not diffs[c.id] and c.id in observed.ownership.healthy]
        keep = good[0] if good else None
        if keep is not None:
            lanes.satisfied.append(keep)
        else:
            lanes.enters.append(d)
            # Running and matching but never confirmed healthy (an apply stopped while it waited): the enter
            # finishes that wait on it instead of restarting a model load that may take minutes.
            waiting = [c for c in mine if c.state == "running" and not diffs[c.id]]
            if waiting:
                lanes.finishing[d.key] = waiting[0]
        for c in mine:
            if c is keep or c is lanes.finishing.get(d.key) or c.id in kept_lanes:
                continue
            why = _replaced_reason(c, d, keep, good, diffs[c.id], parts, desired)
            lanes.leaves.append(_leave(c, why, desired))
    return lanes


def _replaced_reason(
    c: ContainerView,
    d: DesiredAssignment,
    keep: ContainerView | None,
    good: Sequence[ContainerView],
    diff: list[str],
    parts: dict[str, str],
    desired: DesiredState,
) -> str:
    """Why a container of a wanted assignment leaves: a duplicate, not running, changed (by a default a release
    changed, or otherwise), or never healthy."""
    if keep is not None and c in good:
        return f"duplicate of {keep.name} for {d.key}"
    if c.active and c.state != "running":
        return f"{c.name} is {c.state}: it serves nothing; recreate"
    if c.active and diff:
        return upgrades.recreate_reason(c, d, parts, desired) or (
            f"{c.name} differs from what the files now make of {d.recipe} on {','.join(d.slots)}: "
            f"{_changed_text(diff)} changed (hash {c.spec_hash or c.recipe_hash} -> "
            f"{spec.spec_hash(parts)}): recreate"
        )
    if c.active:
        return f"{c.name} never passed its health check and another container of it is finished: remove"
    return _stopped_reason(c)


def _unwanted_leaves(
    desired: DesiredState, ours: Sequence[ContainerView], claimed: set[str], kept_lanes: frozenset[str]
) -> list[Action]:
    """The leaves of the containers of ours that no wanted assignment claims."""
    out: list[Action] = []
    for c in ours:
        if c.id in claimed or c.id in kept_lanes:
            continue
        if c.active:
            why = f"{c.recipe or 'container'} on {','.join(c.slots) or 'no slot'} is not in the manifest"
        else:
            why = _stopped_reason(c) + "; not in the manifest"
        out.append(_leave(c, why, desired))
    return out


def _reclaim(shm: ShmView) -> Action | None:
    """The reclaim of orphan offload files, through the guard; none while the owners cannot be told."""
    orphans = shm.by_state("orphan")
    if not orphans or not (shm.proc.ok and shm.docker.ok):
        return None
    reclaim_bytes = sum(f.allocated_bytes for f in orphans)
    return Action(
        kind=ActionKind.RECLAIM,
        reason=f"{len(orphans)} orphan offload file(s) in {shm.dir} hold {human_bytes(reclaim_bytes)} "
        "with no live mapping, open fd or running offload container",
        paths=tuple(f.path for f in orphans),
        bytes=reclaim_bytes,
    )


def _offload_room(observed: Observed, leaving: Collection[str | None], reclaim: Action | None) -> int:
    """The tmpfs bytes free once the planned leaves and the reclaim are done: what leaving containers own goes
    with them (and the blocked orphans, once every container that blocks them leaves)."""
    shm = observed.shm
    # Owners are named by container name (or id); these are the names of everything planned to leave.
    gone = {n for c in observed.containers if c.id in leaving for n in (c.name, c.id, c.id[:12])}
    # A current vLLM's file, unlinked once mapped (deleted_mapped), is freed the same way: its last holder exits.
    freed_by_leaves = sum(
        f.allocated_bytes
        for f in (*shm.files, *shm.deleted_mapped)
        if f.owners and all(o.container in gone for o in f.owners)
    )
    blocked_orphans = shm.by_state("blocked")
    if blocked_orphans and shm.blocking_containers and all(n in gone for n in shm.blocking_containers):
        freed_by_leaves += sum(f.allocated_bytes for f in blocked_orphans)
    return shm.tmpfs.free_bytes + (reclaim.bytes if reclaim else 0) + freed_by_leaves


def kept_failed(host: str, containers: Sequence[ContainerView], own: Ownership) -> list[ContainerView]:
    """Pure: the failed containers of this install kept for their logs (stopped, named ``NAME-failed-STAMP``),
    newest first; only those whose own labels prove them ours (``owner_kind``). What ``reconciler prune`` removes."""
    found = [c for c in containers if c.preserved and not c.active and is_ours(c, host, own)]
    return sorted(found, key=lambda c: c.name, reverse=True)


def _prunes(desired: DesiredState, observed: Observed, wanted: Collection[str]) -> list[Action]:
    """The failed containers of ours kept for their logs that go: all of an assignment the manifest no longer
    has, and of one it has, all but the newest ``docker.keep_failed`` (their names end in the time they failed).
    Only stopped ones whose own labels prove them this install's (``owner_kind``)."""
    kept: dict[str, list[ContainerView]] = {}
    for c in kept_failed(desired.host.name, observed.containers, observed.ownership):  # newest first
        kept.setdefault(assignment_key(c.recipe or "", c.slots), []).append(c)
    out: list[Action] = []
    for key, cs in sorted(kept.items()):
        assigned = key in wanted
        for c in cs[desired.host.docker.keep_failed :] if assigned else cs:
            why = (
                f"{c.name} is a failed container kept for its logs, and {key} is no longer in the manifest: remove"
                if not assigned
                else f"{c.name} is older than the newest {desired.host.docker.keep_failed} failed container(s) kept "
                f"for {key} (docker.keep_failed): remove"
            )
            out.append(
                Action(
                    kind=ActionKind.PRUNE,
                    reason=why,
                    recipe=c.recipe,
                    container=c.name,
                    container_id=c.id,
                    recipe_hash=c.recipe_hash,
                )
            )
    return out


def _fallbacks(
    desired: DesiredState,
    hold: Mapping[str, str],
    last_good: Sequence[tuple[str, tuple[str, ...]]],
    next_attempt: Mapping[str, float],
) -> tuple[Fallback, ...]:
    """The lanes of the last converged topology that serve held assignments' slots meanwhile: each one whose slots
    all lie within held assignments' slots, on no slot another (not held) assignment wants, whose recipe still
    exists, and that is not itself wanted by the manifest."""
    held = [d for d in desired.assignments if d.key in hold]
    if not held or not last_good:
        return ()
    wanted = {d.key for d in desired.assignments}
    busy = {s for d in desired.assignments if d.key not in hold for s in d.slots}
    held_on = {s: d for d in held for s in d.slots}
    out: list[Fallback] = []
    taken: set[str] = set()
    for recipe, slots in last_good:
        r = desired.recipes.get(recipe)
        if r is None or not slots or assignment_key(recipe, slots) in wanted or r.tensor_parallel_size != len(slots):
            continue
        if any(s not in held_on or s not in desired.host.gpus for s in slots) or set(slots) & (busy | taken):
            continue
        instead = held_on[slots[0]]
        taken.update(slots)
        out.append(Fallback(recipe, tuple(slots), instead.recipe, instead.slots, next_attempt.get(instead.key)))
    return tuple(out)


def _with_paths(leaves: list[Action], observed: Observed) -> list[Action]:
    """Each leave with the offload files it will reclaim once its container stopped: those only its container holds,
    and, on the last leave of the running offload containers, the files they kept from being reclaimed. The plan
    shows them; the leave reclaims no other file."""
    shm = observed.shm
    names = {c.id: c.names for c in observed.containers}
    going: set[str] = set()
    out: list[Action] = []
    blocking = set(shm.blocking_containers)
    last_blocker = None
    for i, a in enumerate(leaves):
        if names.get(a.container_id or "", set()) & blocking:
            last_blocker = i
    for i, a in enumerate(leaves):
        mine = names.get(a.container_id or "", frozenset())
        going |= mine
        paths = [f.path for f in shm.held_only_by(mine)]
        if i == last_blocker and blocking <= going:
            paths += [f.path for f in shm.by_state("blocked")]
        out.append(replace(a, paths=tuple(dict.fromkeys(paths))) if paths else a)
    return out


def _as_assignment(desired: DesiredState, f: Fallback) -> DesiredAssignment:
    r = desired.recipes[f.recipe]
    return DesiredAssignment(f.recipe, f.gpus, r.content_hash(), r.offload.capacity_bytes)


def _matches(c: ContainerView, d: DesiredAssignment, parts: dict[str, str], desired: DesiredState) -> list[str]:
    """Pure: the parts in which a running container of ours differs from what the files make of ``d`` (empty:
    it matches). An adopted container from before spec hashes is judged by its recipe hash and GPU ids."""
    label = c.label(LABEL_SPEC_PARTS)
    if label is None:
        diff = [] if c.recipe_hash == d.recipe_hash else ["recipe"]
        want = {desired.host.gpus[s].preferred_id() for s in d.slots}
        return diff + ([] if set(c.gpu_devices) == want else ["gpus"])
    changed = spec.changed_parts(label, parts)
    if changed == ["env"] and desired.legacy_secret_digests:
        # A lane an earlier version labelled with its secrets' plain digests: the same secrets, not recreated for
        # the upgrade (it is labelled keyed when it is next recreated, or its secret rotated).
        recipe = desired.recipes[d.recipe]
        legacy = spec.part_hashes(desired.host, recipe, d.slots, secret_digests=desired.legacy_secret_digests)
        if not spec.changed_parts(label, legacy):
            return []
    return changed


def _leave(c: ContainerView, why: str, desired: DesiredState) -> Action:
    recipe = desired.recipes.get(c.recipe or "")
    return Action(
        kind=ActionKind.LEAVE,
        reason=why,
        recipe=c.recipe,
        gpus=c.slots,
        container=c.name,
        container_id=c.id,
        recipe_hash=c.recipe_hash,
        offload=c.offload or bool(recipe and recipe.offload.enabled),
        exit_code=c.exit_code if c.state == "exited" else None,
    )


_PART_TEXT = {
    "gpus": "its GPU ids (gpus: or docker.gpu_requests in configs/host.yaml)",
    "recipe": "the recipe's settings",
}


def _changed_text(parts: list[str]) -> str:
    return ", ".join(_PART_TEXT.get(p, f"the {p}") for p in parts)


def _stopped_reason(c: ContainerView) -> str:
    if c.state in NEVER_STARTED_STATES:
        return f"{c.name} was created but never started"
    code = "" if c.exit_code is None else f" with code {c.exit_code}"
    return f"{c.name} is {c.state}{code}"
