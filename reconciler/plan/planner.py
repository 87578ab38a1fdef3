"""The pure planner: ``plan(desired, observed) -> Plan``.

Called by every command that decides (``plan``, ``apply``, ``status``, the loop). It reads plain values and
returns frozen actions in a safe order: leaves first (they free GPU slots and offload files), then a reclaim
of orphan offload files, then enters. It never observes and never acts; ``reconciler.apply`` executes the very
same Plan object. Nothing here imports Docker, NVML or metrics (an import contract test keeps it so).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypedDict
from urllib.parse import urlsplit

from reconciler.base.units import human_bytes
from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe, assignment_key, container_name
from reconciler.plan import spec
from reconciler.plan.observed import (
    LABEL_CREATE_TOKEN,
    LABEL_HOST,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_SPEC_PARTS,
    NEVER_STARTED_STATES,
    ContainerView,
    Observed,
    Ownership,
    ShmView,
)
from reconciler.plan.vram import unlisted_used_bytes


class ActionKind(str, Enum):
    LEAVE = "leave"
    RECLAIM = "reclaim"
    ENTER = "enter"
    PRUNE = "prune"  # remove a failed container kept for its logs (stopped; it holds no slot and no file)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str
    recipe: str | None = None
    gpus: tuple[str, ...] = ()
    container: str | None = None
    container_id: str | None = None
    recipe_hash: str | None = None
    paths: tuple[str, ...] = ()
    bytes: int = 0
    offload: bool = False

    @property
    def key(self) -> str:
        """What this action is about: the assignment (recipe@slots) or, for reclaim, the shm dir."""
        if self.kind is ActionKind.RECLAIM:
            return "reclaim"
        if self.kind is ActionKind.PRUNE:
            return self.container or ""
        return f"{self.recipe}@{'+'.join(self.gpus)}"

    def to_json(self) -> dict:
        return {
            "kind": self.kind.value,
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "container": self.container,
            "paths": list(self.paths),
            "reason": self.reason,
            "container_id": self.container_id,
            "recipe_hash": self.recipe_hash,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class Blocker:
    """A needed change that cannot be made safely; the reconciler never kills what it does not own."""

    recipe: str
    gpus: tuple[str, ...]
    reason: str
    holder: str = ""
    kind: str = ""  # set where the holder alone does not tell the cause ("adopt")

    @property
    def cause(self) -> str:
        """What kind of problem this is, for the advice that goes with it: ``held`` (something not ours, or
        another assignment of ours, holds a slot), ``adopt`` (a container carries this host's labels but not this
        install's id), ``memory`` (the card has VRAM in use and lists no process), ``tmpfs`` (no room for the
        offload file), ``source`` (a source could not vouch for the slots or the offload files: telemetry down,
        GPU not found, /proc unreadable), or a knowable failure of the enter itself: ``image`` (not on the engine),
        ``runtime`` (no NVIDIA runtime for ``docker.gpu_requests``), ``port`` (its port taken), ``recipe`` (its
        command contradicts it)."""
        if self.kind:
            return self.kind
        if self.holder == "tmpfs":
            return "tmpfs"
        return "held" if self.holder else "source"

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "reason": self.reason,
            "holder": self.holder,
            "cause": self.cause,
        }


@dataclass(frozen=True)
class Held:
    """An enter postponed by the caller (a recipe in backoff after a failed enter)."""

    recipe: str
    gpus: tuple[str, ...]
    reason: str

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "gpus": list(self.gpus), "reason": self.reason}


@dataclass(frozen=True)
class Fallback:
    """A slot set that serves the last converged topology's lane while the wanted one waits in backoff."""

    recipe: str
    gpus: tuple[str, ...]
    instead_of: str  # the held assignment's recipe
    instead_gpus: tuple[str, ...]
    next_attempt_s: float | None = None

    @property
    def text(self) -> str:
        when = (
            f"next attempt in {self.next_attempt_s:.0f} s"
            if self.next_attempt_s is not None
            else "next attempt after its backoff"
        )
        return (
            f"fallback: {self.recipe} on {','.join(self.gpus)} while {self.instead_of} on "
            f"{','.join(self.instead_gpus)} is held ({when})"
        )

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "instead_of": self.instead_of,
            "instead_gpus": list(self.instead_gpus),
            "next_attempt_s": self.next_attempt_s,
            "text": self.text,
        }


@dataclass(frozen=True)
class Plan:
    host: str
    actions: tuple[Action, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    held: tuple[Held, ...] = ()
    # Observation sources that failed: the plan is then incomplete and nothing that needs them may run.
    unavailable: tuple[str, ...] = ()
    satisfied: tuple[str, ...] = field(default=())  # container names already matching their assignment
    fallbacks: tuple[Fallback, ...] = ()  # lanes of the last converged topology serving a held lane's slots

    @property
    def blocked(self) -> bool:
        return bool(self.blockers)

    @property
    def changes(self) -> bool:
        return bool(self.actions or self.blockers)

    @property
    def converged(self) -> bool:
        return not self.actions and not self.blockers and not self.held and not self.unavailable

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "changes": self.changes,
            "blocked": self.blocked,
            "actions": [a.to_json() for a in self.actions],
            "blockers": [b.to_json() for b in self.blockers],
            "held": [h.to_json() for h in self.held],
            "unavailable": list(self.unavailable),
            "satisfied": list(self.satisfied),
            "fallbacks": [f.to_json() for f in self.fallbacks],
        }


# ---------------------------------------------------------------- GPU claims


@dataclass(frozen=True)
class SlotIds:
    """Every id a container may use for a GPU slot -> slot name, and which kinds of id nothing here resolves.

    The kinds (``id_kind``): an ``index`` (also ``i:j``, MIG device j of card i), a ``uuid`` (also an old-style MIG id,
    ``MIG-GPU-<uuid>/gi/ci``, by its card's UUID), a ``mig`` device's own UUID, a device node ``minor``
    (``/dev/nvidiaN``), and ``unknown`` (any other text; never resolved). Slots named by index under ``gpu_telemetry:
    none`` cannot tell which card a UUID names (and slots named by UUID cannot tell an index); only NVML tells a card's
    minor number and its MIG devices: a container that names a card so may hold any slot, so it holds them all (fail
    closed, docs/design.md safety rule 11). The same holds for a slot whose ids telemetry did not report.
    """

    ids: Mapping[str, str]
    blind: frozenset[str] = frozenset()  # "uuid", "index", "minor", "mig"

    def slot(self, dev: str) -> str | None:
        found = self.ids.get(dev.lower())
        return found if found is not None else self.ids.get(_id_key(dev))

    def unresolvable(self, dev: str) -> bool:
        """A GPU id that may name a slot's card, though nothing here says which."""
        if self.slot(dev) is not None:
            return False
        kind = id_kind(dev)
        return kind == "unknown" or kind in self.blind


_MIG_INDEX = re.compile(r"^(\d+):(\d+)$")
_CARD_NODE = re.compile(r"^/dev/nvidia(\d+)$")
_OLD_MIG = re.compile(r"^mig-(gpu-[0-9a-f-]+)/\d+/\d+$")
# The id of a container that sees every card (``reconciler.observe.docker_obs.PRIVILEGED``).
PRIVILEGED = "privileged"


def id_kind(dev: str) -> str:
    """Pure: what kind of GPU id a container's ``dev`` is (see ``SlotIds``)."""
    low = dev.lower()
    if low.isdigit() or _MIG_INDEX.match(low):
        return "index"
    if low.startswith("gpu-") or _OLD_MIG.match(low):
        return "uuid"
    if low.startswith("mig-"):
        return "mig"
    if _CARD_NODE.match(dev):
        return "minor"
    return "unknown"


def _id_key(dev: str) -> str:
    """The id a slot is looked up by: an ``i:j`` by card i, an old-style MIG id by its card's UUID."""
    low = dev.lower()
    m = _MIG_INDEX.match(low)
    if m is not None:
        return str(int(m.group(1)))
    m = _OLD_MIG.match(low)
    if m is not None:
        return m.group(1)
    return low if not _CARD_NODE.match(dev) else dev


def device_index(desired: DesiredState, observed: Observed) -> SlotIds:
    """Every id a container may use for a configured GPU (index, UUID) -> slot name."""
    return slot_ids(desired.host, observed)


def slot_ids(host: HostConfig | None, observed: Observed) -> SlotIds:
    """Every id a container may use for a GPU slot (index, UUID, as configured and as telemetry saw it; the card's
    device node and MIG devices as NVML saw them) -> slot name. UUIDs are kept in lower case (``claimed_slots`` looks
    them up so): a container may write one in any letter case and still names that card. The planner and the metrics
    both build their index here."""
    ids: dict[str, str] = {}
    known: dict[str, set[str]] = {}
    if host is not None:
        for slot, gpu in host.gpus.items():
            for dev in gpu.device_ids():
                ids[dev.lower()] = slot
                known.setdefault(slot, set()).add(id_kind(dev))
    for slot, seen in observed.gpus.slots.items():
        known.setdefault(slot, set())
        if seen.missing:
            known[slot].update(("uuid", "index", "minor", "mig"))  # no card: nothing can hold it
            continue
        if seen.uuid:
            ids[seen.uuid.lower()] = slot
            known[slot].add("uuid")
        if seen.index is not None:
            ids[str(seen.index)] = slot
            known[slot].add("index")
        if seen.minor is not None:
            ids[f"/dev/nvidia{seen.minor}"] = slot
            known[slot].add("minor")
        if seen.mig_uuids is not None:
            ids.update({u.lower(): slot for u in seen.mig_uuids})
            known[slot].add("mig")
    kinds = ("uuid", "index", "minor", "mig")
    blind = frozenset(kind for got in known.values() for kind in kinds if kind not in got)
    return SlotIds(ids, blind)


def unresolved_text(dev: str, telemetry: str) -> str:
    """Pure: why a GPU id that nothing here resolves holds every slot, and what would tell its card."""
    kind = id_kind(dev)
    fix = "set gpu_telemetry: nvml" if telemetry != "nvml" else "NVML did not report it for every slot's card"
    if kind == "minor":
        return f"it is given the device node {dev}, and only NVML's minor numbers tell which card that is: {fix}"
    if kind == "mig":
        return f"it names the MIG device {dev}, and only NVML tells which card holds it: {fix}"
    if kind == "unknown":
        return f"it names GPU {dev!r}, which is no id of a card this tool knows (index, UUID, MIG id, /dev/nvidiaN)"
    how = "UUID" if kind == "uuid" else "index"
    return (
        f"it names GPU {dev}, which nothing here matches to a slot without GPU telemetry: name the slots by {how} "
        "in configs/host.yaml, or set gpu_telemetry: nvml"
    )


def claimed_slots(
    c: ContainerView, ids: SlotIds, all_slots: tuple[str, ...], *, host: str | None = None
) -> tuple[str, ...]:
    """The slots a container holds: by our label, its DeviceRequests / visible-devices env, or 'all'; every slot
    when one of its GPU ids is one nothing here resolves (see ``SlotIds``).

    With ``host``, the slot label counts only on a container of that host: another host's slot names are names
    in another host.yaml, and what that container really holds is read from its GPU ids like any other's.
    """
    slots: list[str] = list(c.slots) if (_claims_host(c, host) if host is not None else c.managed) else []
    for dev in c.gpu_devices:
        if dev in ("all", PRIVILEGED) or ids.unresolvable(dev):
            return all_slots
        slot = ids.slot(dev)
        if slot is not None and slot not in slots:
            slots.append(slot)
    return tuple(slots)


def slot_holders(
    desired: DesiredState, observed: Observed, *, skip: Collection[str | None] = ()
) -> dict[str, list[ContainerView]]:
    """Active containers by the GPU slots they hold (containers whose id is in ``skip`` left out)."""
    ids = device_index(desired, observed)
    all_slots = tuple(desired.host.gpus)
    holders: dict[str, list[ContainerView]] = {}
    for c in observed.containers:
        if c.active and c.id not in skip:
            for slot in claimed_slots(c, ids, all_slots, host=desired.host.name):
                holders.setdefault(slot, []).append(c)
    return holders


def _claims_host(c: ContainerView, host: str) -> bool:
    """The container says it is this host's (its own labels, not its image's). Enough to count the slots it
    claims as held, never enough to act on it: see ``owner_kind``."""
    return c.label(LABEL_MANAGED) == "true" and c.label(LABEL_HOST) == host


def owner_kind(c: ContainerView, host: str, own: Ownership) -> str:
    """Whose a container is: ``ours`` (this host's name and this install's id, and its id in this install's record
    of the containers it created, or adopted by the operator), ``copied`` (this install's labels, but an id this
    install never created: a copy made from a lane's labels, by hand or by a tool that recreates containers from
    ``docker inspect``; adopted only by ``reconciler adopt``), ``legacy`` (this host's name but no install id: made
    before install ids, or labelled by hand; adopted only by ``reconciler adopt``), or ``foreign`` (anything else,
    however it is labelled). Labels a container inherited from its image prove nothing: every container made from
    that image carries them. docs/design.md, safety rule 9."""
    if not _claims_host(c, host):
        return "foreign"
    if c.id in own.adopted:
        return "ours"
    install = c.label(LABEL_INSTALL)
    if install is None:
        return "foreign" if LABEL_INSTALL in c.labels else "legacy"
    if own.install_id is None or install != own.install_id:
        return "foreign"
    if own.created is None or c.id in own.created:
        return "ours"  # created None: an install from before the record, whose first apply records its containers
    token = c.label(LABEL_CREATE_TOKEN)
    if token is not None and (c.name, token) in own.pending:
        return "ours"  # a create of this install whose answer was lost: its name and token are in the record
    return "copied"


def _ours(c: ContainerView, host: str, own: Ownership) -> bool:
    return owner_kind(c, host, own) == "ours"


def _matches(c: ContainerView, d: DesiredAssignment, parts: dict[str, str], desired: DesiredState) -> list[str]:
    """Pure: the parts in which a running container of ours differs from what the files make of ``d`` (empty:
    it matches). An adopted container from before spec hashes is judged by its recipe hash and GPU ids."""
    label = c.label(LABEL_SPEC_PARTS)
    if label is None:
        diff = [] if c.recipe_hash == d.recipe_hash else ["recipe"]
        want = {desired.host.gpus[s].preferred_id() for s in d.slots}
        return diff + ([] if set(c.gpu_devices) == want else ["gpus"])
    return spec.changed_parts(label, parts)


def _describe(c: ContainerView) -> str:
    return f"container {c.name} ({c.id[:12]}, {c.state})"


# ---------------------------------------------------------------- the planner


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
    a blocked slot does not leave (it keeps serving while what would replace it cannot enter). Keeping it may hold
    another enter's slot in turn, so the plan is made again with those lanes kept until nothing more is kept.
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
            if a.kind is ActionKind.LEAVE
            and a.container_id in active
            and set(_leave_slots(a, desired, observed)) & blocked_slots
        }
        if not more - keep:
            return p
        keep = keep | {c for c in more if c is not None}
        blocked_before = blocked_before | {assignment_key(b.recipe, b.gpus) for b in p.blockers}


def _leave_slots(a: Action, desired: DesiredState, observed: Observed) -> tuple[str, ...]:
    """The slots a leave frees: its container's slot label and whatever its GPU ids claim."""
    c = next((x for x in observed.containers if x.id == a.container_id), None)
    if c is None:
        return a.gpus
    ids = device_index(desired, observed)
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
    ours = [c for c in observed.containers if _ours(c, host, own) and not (c.preserved and not c.active)]
    # No fallback while any container of the held lane runs (a start whose engine answer was lost, one left
    # waiting for health): the fallback would share its cards.
    running_held = {assignment_key(c.recipe or "", c.slots) for c in ours if c.active and not c.preserved} & set(hold)
    fallbacks = (
        _fallbacks(desired, {k: v for k, v in hold.items() if k not in running_held}, last_good, next_attempt or {})
        if desired.fallback
        else ()
    )
    held_on = {s: d for d in desired.assignments if d.key in hold for s in d.slots}
    # A fallback covers every held lane it stands on (a TP=2 fallback may span two held lanes).
    covered = {held_on[s].key for f in fallbacks for s in f.gpus if s in held_on}
    by_fallback = {assignment_key(f.recipe, f.gpus): f for f in fallbacks}
    wanted = (*desired.assignments, *(_as_assignment(desired, f) for f in fallbacks))
    unsound = _unsound_slots(desired, observed)

    leaves: list[Action] = []
    enters: list[DesiredAssignment] = []
    satisfied: list[ContainerView] = []
    finishing: dict[str, ContainerView] = {}  # assignment key -> its container left waiting for health
    claimed: set[str] = set()

    by_assignment: dict[tuple[str | None, tuple[str, ...]], list[ContainerView]] = {}
    for c in ours:
        if not c.preserved:
            by_assignment.setdefault((c.recipe, c.slots), []).append(c)
    for d in wanted:
        mine = by_assignment.get((d.recipe, d.slots), [])
        claimed.update(c.id for c in mine)
        parts = spec.part_hashes(
            desired.host, desired.recipes[d.recipe], d.slots, secret_digests=desired.secret_digests
        )
        diffs = {c.id: _matches(c, d, parts, desired) for c in mine}
        # Satisfied only once it has passed its health check: one left waiting by an interrupted apply never did.
        good = [c for c in mine if c.state == "running" and not diffs[c.id] and c.id in own.healthy]
        keep = good[0] if good else None
        if keep is not None:
            satisfied.append(keep)
        else:
            enters.append(d)
            # Running and matching but never confirmed healthy (an apply stopped while it waited): the enter
            # finishes that wait on it instead of restarting a model load that may take minutes.
            waiting = [c for c in mine if c.state == "running" and not diffs[c.id]]
            if waiting:
                finishing[d.key] = waiting[0]
        for c in mine:
            if c is keep or c is finishing.get(d.key):
                continue
            if keep is not None and c in good:
                why = f"duplicate of {keep.name} for {d.key}"
            elif c.active and c.state != "running":
                why = f"{c.name} is {c.state}: it serves nothing; recreate"
            elif c.active and diffs[c.id]:
                why = (
                    f"{c.name} differs from what the files now make of {d.recipe} on {','.join(d.slots)}: "
                    f"{_changed_text(diffs[c.id])} changed (hash {c.spec_hash or c.recipe_hash} -> "
                    f"{spec.spec_hash(parts)}): recreate"
                )
            elif c.active:
                why = f"{c.name} never passed its health check and another container of it is finished: remove"
            else:
                why = _stopped_reason(c)
            if c.id not in kept_lanes:
                leaves.append(_leave(c, why, desired))

    for c in ours:
        if c.id in claimed or c.id in kept_lanes:
            continue
        if c.active:
            why = f"{c.recipe or 'container'} on {','.join(c.slots) or 'no slot'} is not in the manifest"
        else:
            why = _stopped_reason(c) + "; not in the manifest"
        leaves.append(_leave(c, why, desired))

    shm = observed.shm
    leaves = _with_paths(leaves, observed)
    leaving = {a.container_id for a in leaves}
    kept_ids = {c.id for c in satisfied} | {c.id for c in finishing.values()} | set(kept_lanes)

    # Offload files: orphans are reclaimed through the guard; what leaving containers own goes with them.
    reclaim: Action | None = None
    orphans = shm.by_state("orphan")
    proc_ok = shm.proc.ok and shm.docker.ok
    if orphans and proc_ok:
        reclaim_bytes = sum(f.allocated_bytes for f in orphans)
        reclaim = Action(
            kind=ActionKind.RECLAIM,
            reason=f"{len(orphans)} orphan offload file(s) in {shm.dir} hold {human_bytes(reclaim_bytes)} "
            "with no live mapping, open fd or running offload container",
            paths=tuple(f.path for f in orphans),
            bytes=reclaim_bytes,
        )
    # Owners are named by container name (or id); these are the names of everything planned to leave.
    gone = {n for c in observed.containers if c.id in leaving for n in (c.name, c.id, c.id[:12])}
    freed_by_leaves = sum(
        f.allocated_bytes for f in shm.files if f.owners and all(o.container in gone for o in f.owners)
    )
    blocked_orphans = shm.by_state("blocked")
    if blocked_orphans and shm.blocking_containers and all(n in gone for n in shm.blocking_containers):
        freed_by_leaves += sum(f.allocated_bytes for f in blocked_orphans)
    # shm.reserve_gib stays free beyond every offload file: judged here, not only against the tmpfs size at load.
    reserve = desired.host.shm.reserve_bytes
    room = shm.tmpfs.free_bytes + (reclaim.bytes if reclaim else 0) + freed_by_leaves

    holders = slot_holders(desired, observed, skip=leaving | {c.id for c in finishing.values()})
    by_id = {c.id: c for c in observed.containers}
    blockers: list[Blocker] = []
    held: list[Held] = []
    enter_actions: list[Action] = []
    fallback_ids = {c.id for c in ours if assignment_key(c.recipe or "", c.slots) in by_fallback}
    for d in enters:
        recipe = desired.recipes[d.recipe]
        is_fallback = d.key in by_fallback
        if d.key in covered and d.key in hold:
            # Its slots serve the fallback meanwhile: held, not blocked by the fallback; anything else that holds
            # its slots is still said.
            own_holders = {s: [c for c in cs if c.id not in fallback_ids] for s, cs in holders.items()}
            problems = _slot_problems(d, observed, own_holders, by_id, leaving, kept_ids | fallback_ids, desired)
            problems += _identity_problems(d, desired, observed, unsound, leaving)
            if not problems:
                held.append(Held(recipe=d.recipe, gpus=d.slots, reason=hold[d.key]))
                continue
            for why, holder, *kind in problems:
                blockers.append(Blocker(recipe=d.recipe, gpus=d.slots, reason=why, holder=holder, kind="".join(kind)))
            continue
        # A lane of ours kept on a slot because a blocker is there: no cause of the enter the round before found
        # blocked (its own causes are said), and for any other enter a cause said as such.
        d_holders = {s: [c for c in cs if c.id not in kept_lanes] for s, cs in holders.items()}
        problems = _slot_problems(d, observed, d_holders, by_id, leaving, kept_ids, desired)
        if d.key not in blocked_before:
            problems += [
                (
                    f"{_describe(c)} holds GPU slot {s} and keeps serving it: the lane that would replace it there "
                    "is blocked",
                    c.name,
                )
                for s in d.slots
                for c in holders.get(s, ())
                if c.id in kept_lanes
            ]
        problems += _identity_problems(d, desired, observed, unsound, leaving)
        if d.key not in finishing and d.key not in hold:
            # The lane's own containers, those leaving first, and lanes kept on its slots may hold its ports.
            own_ids = {c.id for c in by_assignment.get((d.recipe, d.slots), [])} | {
                c.id for s in d.slots for c in holders.get(s, ()) if c.id in kept_lanes
            }
            problems += enter_problems(d, desired, observed, own=leaving | own_ids)
        if d.offload_bytes and d.key not in finishing:  # a container being finished has its offload file already
            if not proc_ok:
                problems.append(("offload files cannot be inspected: " + _sources(shm), ""))
            elif d.offload_bytes + reserve > room:
                problems.append(
                    (
                        f"tmpfs {shm.dir} would have {human_bytes(room)} free after planned leaves and reclaim; "
                        f"recipe {d.recipe} needs {human_bytes(d.offload_bytes)} for its offload file"
                        + (f" and shm.reserve_gib keeps {human_bytes(reserve)} free beyond it" if reserve else ""),
                        "tmpfs",
                    )
                )
        if problems and is_fallback:
            continue  # a fallback that cannot be placed is simply not used: the held lane stays held, not blocked
        if problems:
            for why, holder, *kind in problems:
                blockers.append(Blocker(recipe=d.recipe, gpus=d.slots, reason=why, holder=holder, kind="".join(kind)))
            continue
        if d.key in hold:
            held.append(Held(recipe=d.recipe, gpus=d.slots, reason=hold[d.key]))
            continue
        room -= d.offload_bytes
        fin = finishing.get(d.key)
        enter_actions.append(
            Action(
                kind=ActionKind.ENTER,
                reason=(
                    f"finish {fin.name}: it was left waiting for its health check (an apply stopped meanwhile); "
                    "wait for it again rather than restart its model load"
                )
                if fin is not None
                else by_fallback[d.key].text
                if d.key in by_fallback
                else _enter_reason(d, by_assignment.get((d.recipe, d.slots), [])),
                container_id=fin.id if fin is not None else None,
                recipe=d.recipe,
                gpus=d.slots,
                container=container_name(d.recipe, d.slots),
                recipe_hash=d.recipe_hash,
                bytes=d.offload_bytes,
                offload=recipe.offload.enabled,
            )
        )

    actions: list[Action] = [*leaves]
    if reclaim is not None:
        actions.append(reclaim)
    actions.extend(enter_actions)
    actions.extend(_prunes(desired, observed, {d.key for d in wanted}))
    placed = {a.key for a in enter_actions} | {assignment_key(c.recipe or "", c.slots) for c in satisfied}
    return Plan(
        host=host,
        actions=tuple(actions),
        blockers=tuple(blockers),
        held=tuple(held),
        unavailable=unavailable,
        satisfied=tuple(c.name for c in satisfied),
        # Only the fallbacks that run or are entered in this plan (one that cannot be placed is not in force).
        fallbacks=tuple(f for f in fallbacks if assignment_key(f.recipe, f.gpus) in placed),
    )


def kept_failed(host: str, containers: Sequence[ContainerView], own: Ownership) -> list[ContainerView]:
    """Pure: the failed containers of this install kept for their logs (stopped, named ``NAME-failed-STAMP``),
    newest first; only those whose own labels prove them ours (``owner_kind``). What ``reconciler prune`` removes."""
    found = [c for c in containers if c.preserved and not c.active and _ours(c, host, own)]
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


# ---------------------------------------------------------------- knowable failures of an enter


class EnterNeeds(TypedDict):
    images: tuple[str, ...]
    ports: tuple[int, ...]


def enter_needs(desired: DesiredState) -> EnterNeeds:
    """What observation must look up for ``enter_problems``: the images the recipes name and the ports of their
    health and probe URLs. Keyword arguments of ``reconciler.observe.observe``."""
    images: dict[str, None] = {}
    ports: dict[int, None] = {}
    for name in dict.fromkeys(a.recipe for a in desired.assignments):
        r = desired.recipes.get(name)
        if r is None:
            continue
        images[r.container.image] = None
        ports.update(dict.fromkeys(recipe_ports(r)))
    return {"images": tuple(images), "ports": tuple(ports)}


def recipe_ports(recipe: Recipe) -> tuple[int, ...]:
    """Pure: the loopback ports a recipe's lane answers on, by its health URL and its probes' origins."""
    urls = [recipe.health.url, *(p.base_url for p in recipe.probes)]
    out: list[int] = []
    for url in urls:
        if not url:
            continue
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue
        if port not in out:
            out.append(port)
    return tuple(out)


def command_tensor_parallel_size(command: Sequence[str]) -> int | None:
    """Pure: the ``--tensor-parallel-size`` (or ``-tp``) a vLLM command line gives, or None when it gives none; the
    last one given, as vLLM's parser reads it."""
    found: int | None = None
    for i, arg in enumerate(command):
        for flag in ("--tensor-parallel-size", "-tp"):
            value = None
            if arg == flag and i + 1 < len(command):
                value = command[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
            if value is not None:
                found = int(value) if value.strip().isdigit() else None
    return found


def enter_problems(
    d: DesiredAssignment, desired: DesiredState, observed: Observed, *, own: Collection[str | None]
) -> list[tuple[str, ...]]:
    """Why an enter would fail however free its slots are, known before anything stops for it: its image is not on
    the engine (the tool never pulls), the engine cannot give GPUs by DeviceRequest under ``docker.gpu_requests:
    true``, something other than its own lane (``own``: its containers and those leaving first) listens on its
    health or probe port, or its command's ``--tensor-parallel-size`` is not the recipe's. Each says the fix."""
    recipe = desired.recipes[d.recipe]
    facts = observed.enter
    problems: list[tuple[str, ...]] = []
    image = recipe.container.image
    if facts.image_present(image) is False:
        problems.append(
            (
                f"image {image} is not present on this host: pull or build it (recipe {d.recipe}, "
                "container.image); the tool never pulls",
                "",
                "image",
            )
        )
    host = desired.host
    if host.docker.gpu_requests and facts.gpu_runtime == "absent":
        problems.append(
            (
                f"the engine at {host.docker.url} has no NVIDIA runtime ({facts.gpu_runtime_detail}), and "
                "docker.gpu_requests: true asks it for GPUs by DeviceRequest: install the NVIDIA container toolkit "
                "(nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` and restart the "
                "engine), or set docker.gpu_requests: false in configs/host.yaml on a host without it",
                "",
                "runtime",
            )
        )
    tp = command_tensor_parallel_size(recipe.container.command)
    if tp is not None and tp != recipe.tensor_parallel_size:
        problems.append(
            (
                f"recipe {d.recipe}: its command says --tensor-parallel-size {tp} but tensor_parallel_size = "
                f"{recipe.tensor_parallel_size}: make them equal in configs/recipes/{d.recipe}.toml",
                "",
                "recipe",
            )
        )
    by_id = {c.id: c for c in observed.containers}
    mine = [c for c in observed.containers if c.id in own and c.active]
    for port in recipe_ports(recipe):
        listeners = facts.listening(port)
        for x in listeners or ():
            owner = by_id.get(x.container_id) if x.container_id else None
            if owner is None and x.pid is not None:
                # The engine's proxy process serves a bridged container's published port.
                owner = next((c for c in observed.containers if c.active and port in c.published_ports), None)
            if owner is not None and owner.id in own:
                continue
            if owner is None and x.pid is None and mine:
                continue  # a socket no readable process holds, while its own lane runs: judged after its leave
            who = (
                f"container {owner.name}"
                if owner is not None
                else f"pid {x.pid} ({x.command or 'a process'}) in no container of this engine"
                if x.pid is not None
                else "a socket no process here can be seen holding"
            )
            url = recipe.health.url or ""
            problems.append(
                (
                    f"port {port} of recipe {d.recipe} ({url or 'probes'}) is already listened on ({x.address}:{port}"
                    f", {who}) before {container_name(d.recipe, d.slots)} is started: its health check could not "
                    "tell the new engine from it. Stop what listens there, or give the recipe another port and "
                    "health.url; nothing was created",
                    owner.name if owner is not None else (f"pid {x.pid}" if x.pid is not None else f"port {port}"),
                    "port",
                )
            )
            break
    return problems


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


def _unsound_slots(desired: DesiredState, observed: Observed) -> dict[str, str]:
    """Defence in depth for what the loader and the GPU view already refuse: slot -> why it cannot be used, when two
    assignments give it away twice, or two slots name one physical card (by id text in any letter case, or by what
    GPU telemetry resolved them to)."""
    bad: dict[str, str] = {}
    given: dict[str, str] = {}
    for d in desired.assignments:
        for s in d.slots:
            if s in given and given[s] != d.key:
                bad[s] = f"GPU slot {s} is given to both {given[s]} and {d.key} (one recipe per GPU)"
            given.setdefault(s, d.key)
        if len(set(d.slots)) != len(d.slots):
            for s in d.slots:
                bad[s] = f"{d.key} names GPU slot {s} twice"
    card: dict[str, str] = {}
    for slot, gpu in desired.host.gpus.items():
        seen = observed.gpus.slots.get(slot)
        ids = {i.lower() for i in gpu.device_ids()}
        if seen is not None and not seen.missing and seen.uuid:
            ids = {seen.uuid.lower()}
        for i in sorted(ids):
            if i in card and card[i] != slot:
                why = (
                    f"GPU slots {card[i]} and {slot} are one physical card ({i}): give each slot its own card in "
                    "configs/host.yaml"
                )
                bad[slot] = bad[card[i]] = why
            card.setdefault(i, slot)
    return bad


def _identity_problems(
    d: DesiredAssignment,
    desired: DesiredState,
    observed: Observed,
    unsound: Mapping[str, str],
    leaving: set[str | None],
) -> list[tuple[str, ...]]:
    """Why ``d`` cannot be entered whatever holds its slots: a slot given twice or sharing a card, or a container
    that is not ours already carrying the name its container would get (the engine would refuse the create)."""
    problems: list[tuple[str, ...]] = [(unsound[s], "") for s in dict.fromkeys(d.slots) if s in unsound]
    name = container_name(d.recipe, d.slots)
    for c in observed.containers:
        if c.name == name and c.id not in leaving and not _ours(c, desired.host.name, observed.ownership):
            problems.append(
                (
                    f"{_describe(c)} already carries the name {name} and is not managed by this tool: rename or "
                    f"remove it (docker rm {c.name})",
                    c.name,
                )
            )
    return problems


def _with_paths(leaves: list[Action], observed: Observed) -> list[Action]:
    """Each leave with the offload files it will reclaim once its container stopped: those only its container holds,
    and, on the last leave of the running offload containers, the files they kept from being reclaimed. The plan
    shows them; the leave reclaims no other file."""
    shm = observed.shm
    names = {c.id: {c.name, c.id, c.id[:12]} for c in observed.containers}
    going: set[str] = set()
    out: list[Action] = []
    blocking = set(shm.blocking_containers)
    last_blocker = None
    for i, a in enumerate(leaves):
        if names.get(a.container_id or "", set()) & blocking:
            last_blocker = i
    for i, a in enumerate(leaves):
        mine = names.get(a.container_id or "", set())
        going |= mine
        paths = [f.path for f in shm.files if f.owners and all(o.container in mine for o in f.owners)]
        if i == last_blocker and blocking <= going:
            paths += [f.path for f in shm.by_state("blocked")]
        out.append(replace(a, paths=tuple(dict.fromkeys(paths))) if paths else a)
    return out


def _as_assignment(desired: DesiredState, f: Fallback) -> DesiredAssignment:
    r = desired.recipes[f.recipe]
    return DesiredAssignment(f.recipe, f.gpus, r.content_hash(), r.offload.capacity_bytes)


def _slot_problems(
    d: DesiredAssignment,
    observed: Observed,
    holders: Mapping[str, list[ContainerView]],
    by_id: Mapping[str, ContainerView],
    leaving: set[str | None],
    kept: set[str],
    desired: DesiredState,
) -> list[tuple[str, ...]]:
    """Why the slots of ``d`` are not free once the planned leaves are done (empty: free)."""
    problems: list[tuple[str, ...]] = []
    gpus = observed.gpus
    ids = device_index(desired, observed)
    going_or_kept = _claimed_by(ids, desired, observed, leaving | kept)
    if not gpus.source.ok:
        problems.append((f"GPU telemetry ({gpus.telemetry}) unavailable: {gpus.source.detail}", ""))
    seen: dict[str, list[str]] = {}
    order: list[ContainerView] = []
    for slot in d.slots:
        for c in holders.get(slot, ()):
            if c.id not in seen:
                seen[c.id] = []
                order.append(c)
            seen[c.id].append(slot)
    for c in order:
        kind = owner_kind(c, desired.host.name, observed.ownership)
        unresolved = [dev for dev in c.gpu_devices if dev not in ("all", PRIVILEGED) and ids.unresolvable(dev)]
        held = f"{_describe(c)} {'may hold' if unresolved else 'holds'} GPU slot {','.join(seen[c.id])}"
        if PRIVILEGED in c.gpu_devices:
            held += " (it runs privileged: every card of the host is in it)"
        elif unresolved:
            held += f" ({unresolved_text(unresolved[0], gpus.telemetry)})"
        else:
            nodes = [dev for dev in c.gpu_devices if id_kind(dev) == "minor" and ids.slot(dev) in seen[c.id]]
            if nodes:
                held += f" (by its device node {nodes[0]})"
        if kind == "legacy":
            problems.append(
                (
                    f"{held} and carries this host's labels but not this install's id (made by an earlier version "
                    f"of this tool, or labelled by hand): if it is this host's lane, adopt it with "
                    f"`reconciler adopt {c.name}`; otherwise remove it",
                    c.name,
                    "adopt",
                )
            )
            continue
        if kind == "copied":
            problems.append(
                (
                    f"{held} and carries this install's labels but was not created by it (a copy made from a lane's "
                    f"labels): it is never stopped unasked; if it is this host's lane, adopt it with "
                    f"`reconciler adopt {c.name}`; otherwise remove it",
                    c.name,
                    "adopt",
                )
            )
            continue
        who = "managed by this tool for another assignment" if kind == "ours" else "not managed by this tool"
        other = c.label(LABEL_HOST)
        if kind == "foreign" and other and other != desired.host.name:
            # A lane of this tool for another host name (another root on this machine, the demo's): say whose.
            fix = "; `bash examples/demo/run.sh --teardown` removes it" if other == "demo" else ""
            who = (
                f"not managed by this host's install: it belongs to host {other} of this tool (another root: "
                f"assign nothing there and apply to stop it{fix})"
            )
        problems.append((f"{held} and is {who}", c.name))
    for slot in d.slots:
        view = gpus.slots.get(slot)
        if view is None:
            continue
        if view.missing:
            problems.append((f"GPU for slot {slot} not found on this host ({view.error or 'missing'})", ""))
            continue
        for p in view.processes:
            owner = by_id.get(p.container_id) if p.container_id else None
            if owner is not None and (owner.id in leaving):
                continue  # goes away with a planned leave
            if not p.resolved and slot in going_or_kept:
                # A pid of another pid namespace (WSL2) on a card a leaving or kept container of ours claims: most
                # likely that container's; judged again after the leave (the plan is made again after each action).
                continue
            if owner is not None and owner.id in kept and slot in owner.slots:
                continue
            where = f"container {owner.name}" if owner else ("a container" if p.container_id else "no container")
            cmd = f" ({p.command})" if p.command else ""
            problems.append((f"pid {p.pid}{cmd} in {where} uses GPU slot {slot}", f"pid {p.pid}"))
    problems.extend(_memory_problems(d, observed, holders, leaving | kept, desired, ids))
    return problems


def _memory_problems(
    d: DesiredAssignment,
    observed: Observed,
    holders: Mapping[str, list[ContainerView]],
    leaving: set[str | None],
    desired: DesiredState,
    ids: SlotIds,
) -> list[tuple[str, ...]]:
    """Occupancy by memory: a slot no container holds and whose card lists no process, yet reports more VRAM in
    use than its idle baseline, is held by something NVML does not show (on WSL2: a Windows program, a process of
    another pid namespace). "I see no process" is not "free". A slot a leaving container claims is judged again
    after its leave (the apply layer re-plans after every action)."""
    gpus = observed.gpus
    if gpus.telemetry != "nvml" or not gpus.source.ok:
        return []
    going = _claimed_by(ids, desired, observed, leaving)
    problems: list[tuple[str, ...]] = []
    for slot in d.slots:
        if slot in going or holders.get(slot):
            continue
        used = unlisted_used_bytes(desired.host, gpus.slots.get(slot))
        if used is None:
            continue
        idle = desired.host.idle_used_bytes(slot)
        problems.append(
            (
                f"{human_bytes(used)} in use on {slot} and no visible process (more than its idle "
                f"{human_bytes(idle)}, gpu_reserve.idle_used_gib): something NVML does not list holds the card",
                f"{human_bytes(used)} unlisted",
                "memory",
            )
        )
    return problems


def _claimed_by(
    ids: SlotIds, desired: DesiredState, observed: Observed, containers: Collection[str | None]
) -> set[str]:
    """The slots the active containers whose ids are in ``containers`` claim."""
    all_slots = tuple(desired.host.gpus)
    return {
        slot
        for c in observed.containers
        if c.id in containers and c.active
        for slot in claimed_slots(c, ids, all_slots, host=desired.host.name)
    }


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


def _enter_reason(d: DesiredAssignment, mine: list[ContainerView]) -> str:
    if any(c.active for c in mine):
        return f"recreate {d.recipe} on {','.join(d.slots)} once the container it replaces has left"
    return f"manifest gives {','.join(d.slots)} to {d.recipe}; no container of it is running"


def _sources(shm: ShmView) -> str:
    return ", ".join(f"{s.name} {s.render()}" for s in (shm.proc, shm.docker) if not s.ok)
