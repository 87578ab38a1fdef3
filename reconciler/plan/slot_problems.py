"""Why an enter's GPU slots are not free once the planned leaves are done: containers that hold them (and whose
they are), GPU processes on them, VRAM in use that no process explains, a slot given twice or two slots on one
card, a foreign container already carrying the lane's name.

Pure. Called by ``reconciler.plan.planner`` for each enter; each problem is a ``Problem`` (reason, holder, cause)
the planner makes a ``Blocker`` of.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.base.units import human_bytes
from reconciler.model import DesiredAssignment, DesiredState, container_name
from reconciler.plan.causes import BlockerCause, Problem, Problems
from reconciler.plan.claims import (
    DEVICE_RULE,
    EVERY_CARD,
    PRIVILEGED,
    SlotIds,
    claimed_by,
    describe_container,
    id_kind,
    is_ours,
    node_slots,
    owner_kind,
    slot_ids,
    unresolved_text,
)
from reconciler.plan.observed import LABEL_HOST, ContainerView, Observed
from reconciler.plan.vram import unlisted_used_bytes


def unsound_slots(desired: DesiredState, observed: Observed) -> dict[str, str]:
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


def identity_problems(
    d: DesiredAssignment,
    desired: DesiredState,
    observed: Observed,
    unsound: Mapping[str, str],
    leaving: set[str | None],
) -> Problems:
    """Why ``d`` cannot be entered whatever holds its slots: a slot given twice or sharing a card, or a container
    that is not ours already carrying the name its container would get (the engine would refuse the create)."""
    problems = [Problem(unsound[s], "", BlockerCause.UNSEEN) for s in dict.fromkeys(d.slots) if s in unsound]
    name = container_name(d.recipe, d.slots)
    for c in observed.containers:
        if c.name == name and c.id not in leaving and not is_ours(c, desired.host.name, observed.ownership):
            problems.append(
                Problem(
                    f"{describe_container(c)} already carries the name {name} and is not managed by this tool: rename or "
                    f"remove it (docker rm {c.name})",
                    c.name,
                    BlockerCause.HELD,
                )
            )
    return problems


def slot_problems(
    d: DesiredAssignment,
    observed: Observed,
    holders: Mapping[str, list[ContainerView]],
    by_id: Mapping[str, ContainerView],
    leaving: set[str | None],
    kept: set[str],
    desired: DesiredState,
) -> Problems:
    """Why the slots of ``d`` are not free once the planned leaves are done (empty: free)."""
    problems: Problems = []
    gpus = observed.gpus
    ids = slot_ids(desired.host, observed)
    if not gpus.reading.ok:
        problems.append(
            Problem(f"GPU telemetry ({gpus.telemetry}) unavailable: {gpus.reading.detail}", "", BlockerCause.UNSEEN)
        )
    for c, slots in _holders_of(d, holders):
        problems.append(_holder_problem(c, slots, ids, observed, desired))
    going_or_kept = claimed_by(ids, desired, observed, leaving | kept)
    problems.extend(_process_problems(d, observed, by_id, leaving, kept, going_or_kept))
    problems.extend(node_problems(d, observed, holders, by_id, leaving, kept, ids))
    problems.extend(memory_problems(d, observed, holders, leaving | kept, desired, ids))
    return problems


def _holders_of(
    d: DesiredAssignment, holders: Mapping[str, list[ContainerView]]
) -> list[tuple[ContainerView, list[str]]]:
    """The containers holding slots of ``d``, in the order of its slots, each with the slots it holds of them."""
    seen: dict[str, list[str]] = {}
    order: dict[str, ContainerView] = {}
    for slot in d.slots:
        for c in holders.get(slot, ()):
            order.setdefault(c.id, c)
            seen.setdefault(c.id, []).append(slot)
    return [(c, seen[i]) for i, c in order.items()]


def _holder_problem(
    c: ContainerView, slots: list[str], ids: SlotIds, observed: Observed, desired: DesiredState
) -> Problem:
    """What a container holding slots of an enter is, and what the operator can do about it."""
    held = _held_text(c, slots, ids, observed.gpus.telemetry)
    kind = owner_kind(c, desired.host.name, observed.ownership)
    if kind == "legacy":
        return Problem(
            f"{held} and carries this host's labels but not this install's id (made by an earlier version "
            f"of this tool, or labelled by hand): if it is this host's lane, adopt it with "
            f"`reconciler adopt {c.name}`; otherwise remove it",
            c.name,
            BlockerCause.ADOPT,
        )
    if kind == "copied":
        return Problem(
            f"{held} and carries this install's labels but was not created by it (a copy made from a lane's "
            f"labels): it is never stopped unasked; if it is this host's lane, adopt it with "
            f"`reconciler adopt {c.name}`; otherwise remove it",
            c.name,
            BlockerCause.ADOPT,
        )
    who = "managed by this tool for another assignment" if kind == "ours" else "not managed by this tool"
    other = c.label(LABEL_HOST)
    if kind == "foreign" and other and other != desired.host.name:
        # A lane of this tool for another host name (another root on this machine, the demo's): say whose.
        fix = "; `bash examples/demo/run.sh --teardown` removes it" if other == "demo" else ""
        who = (
            f"not managed by this host's install: it belongs to host {other} of this tool (another root: "
            f"assign nothing there and apply to stop it{fix})"
        )
    return Problem(f"{held} and is {who}", c.name, BlockerCause.HELD)


def _held_text(c: ContainerView, slots: list[str], ids: SlotIds, telemetry: str) -> str:
    """ "container X holds GPU slot S", with how it holds it where its GPU ids alone do not say."""
    unresolved = [dev for dev in c.gpu_devices if dev not in EVERY_CARD and ids.unresolvable(dev)]
    held = f"{describe_container(c)} {'may hold' if unresolved else 'holds'} GPU slot {','.join(slots)}"
    if PRIVILEGED in c.gpu_devices:
        return held + " (it runs privileged: every card of the host is in it)"
    if DEVICE_RULE in c.gpu_devices:
        return held + (
            " (a device cgroup rule lets it open every card's node (major 195), and it has one or can make one: "
            "/dev bound in, or CAP_MKNOD)"
        )
    if unresolved:
        return held + f" ({unresolved_text(unresolved[0], telemetry)})"
    nodes = [dev for dev in c.gpu_devices if id_kind(dev) == "minor" and ids.slot(dev) in slots]
    return held + f" (by its device node {nodes[0]})" if nodes else held


def _process_problems(
    d: DesiredAssignment,
    observed: Observed,
    by_id: Mapping[str, ContainerView],
    leaving: set[str | None],
    kept: set[str],
    going_or_kept: set[str],
) -> Problems:
    """The slots of ``d`` whose card is missing, and the GPU processes on them that no planned leave or kept lane
    of ours accounts for."""
    problems: Problems = []
    for slot in d.slots:
        view = observed.gpus.slots.get(slot)
        if view is None:
            continue
        if view.missing:
            problems.append(
                Problem(
                    f"GPU for slot {slot} not found on this host ({view.error or 'missing'})", "", BlockerCause.UNSEEN
                )
            )
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
            problems.append(
                Problem(f"pid {p.pid}{cmd} in {where} uses GPU slot {slot}", f"pid {p.pid}", BlockerCause.HELD)
            )
    return problems


def node_problems(
    d: DesiredAssignment,
    observed: Observed,
    holders: Mapping[str, list[ContainerView]],
    by_id: Mapping[str, ContainerView],
    leaving: set[str | None],
    kept: set[str],
    ids: SlotIds,
) -> Problems:
    """The processes that hold the node of a card of ``d`` open (a descriptor on 195:N, whatever their container's
    configuration says): all but those of a container leaving first or of a lane of ours kept on its own slots, and
    those named already (their container holds the slot, or NVML lists them on its card). A node whose card nothing
    here resolves (no minor numbers without NVML) may be any slot's. Without the /proc scan none is known free."""
    nodes = observed.card_nodes
    if not nodes.read:
        return [
            Problem(f"who holds a card's device node open could not be read ({nodes.detail})", "", BlockerCause.UNSEEN)
        ]
    problems: Problems = []
    for h in nodes.holders:
        node = f"/dev/nvidia{h.minor}"
        on = node_slots(h.minor, ids, d.slots)
        owner = by_id.get(h.container_id) if h.container_id else None
        for s in on:
            if owner is not None and (owner.id in leaving or (owner.id in kept and s in owner.slots)):
                continue  # goes away with a planned leave, or a kept lane of ours on its own card
            view = observed.gpus.slots.get(s)
            if (owner is not None and owner in holders.get(s, ())) or (
                view is not None and any(p.pid == h.pid for p in view.processes)
            ):
                continue  # named already
            where = f"container {h.container}" if h.container else "no container"
            cmd = f" ({h.command})" if h.command else ""
            how = (
                ""
                if ids.slot(node) is not None
                else " (only NVML's minor numbers tell which card that is: it may be any)"
            )
            problems.append(
                Problem(
                    f"pid {h.pid}{cmd} in {where} holds {node} open{how}, so it holds GPU slot {s}: it can use the "
                    "card though NVML lists no process of it (no CUDA context yet)",
                    f"pid {h.pid}",
                    BlockerCause.HELD,
                )
            )
            break
    return problems


def memory_problems(
    d: DesiredAssignment,
    observed: Observed,
    holders: Mapping[str, list[ContainerView]],
    leaving: set[str | None],
    desired: DesiredState,
    ids: SlotIds,
) -> Problems:
    """Occupancy by memory: a slot no container holds and whose card lists no process, yet reports more VRAM in
    use than its idle baseline, is held by something NVML does not show (on WSL2: a Windows program, a process of
    another pid namespace). "I see no process" is not "free". A slot a leaving container claims is judged again
    after its leave (the apply layer re-plans after every action)."""
    gpus = observed.gpus
    if gpus.telemetry != "nvml" or not gpus.reading.ok:
        return []
    going = claimed_by(ids, desired, observed, leaving)
    problems: Problems = []
    for slot in d.slots:
        if slot in going or holders.get(slot):
            continue
        used = unlisted_used_bytes(desired.host, gpus.slots.get(slot))
        if used is None:
            continue
        idle = desired.host.idle_used_bytes(slot)
        problems.append(
            Problem(
                f"{human_bytes(used)} in use on {slot} and no visible process (more than its idle "
                f"{human_bytes(idle)}, gpu_reserve.idle_used_gib): something NVML does not list holds the card",
                f"{human_bytes(used)} unlisted",
                BlockerCause.MEMORY,
            )
        )
    return problems
