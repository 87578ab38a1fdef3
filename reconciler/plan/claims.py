"""GPU claims: which GPU slots a container holds (by our slot label, its GPU ids, ``all`` or ``--privileged``) and
whose container it is (``owner_kind``, docs/design.md safety rule 9).

Pure. Called by the planner (``slot_holders``, ``owner_kind``), the apply layer, the status view and the metrics
(``slot_ids``, ``claimed_slots``); ``id_kind`` also tells the Docker observer's tests what kind of id they parsed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from reconciler.model import DesiredState, HostConfig
from reconciler.plan.observed import (
    LABEL_CREATE_TOKEN,
    LABEL_HOST,
    LABEL_INSTALL,
    LABEL_MANAGED,
    ContainerView,
    Observed,
    Ownership,
)


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
# The id of a container that sees every card (``reconciler.observe.containers.PRIVILEGED``), and of one whose device
# cgroup rules let it open every card's node (``reconciler.observe.device_rules.DEVICE_RULE``).
PRIVILEGED = "privileged"
DEVICE_RULE = "device-rule"
EVERY_CARD = ("all", PRIVILEGED, DEVICE_RULE)


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
        if dev in EVERY_CARD or ids.unresolvable(dev):
            return all_slots
        slot = ids.slot(dev)
        if slot is not None and slot not in slots:
            slots.append(slot)
    return tuple(slots)


def node_slots(minor: int, ids: SlotIds, slots: tuple[str, ...]) -> tuple[str, ...]:
    """Of ``slots``, those whose card a process holding node 195:``minor`` open holds: the slot NVML's minor numbers
    give it, or every one where nothing here resolves a minor (docs/design.md, safety rule 11)."""
    node = f"/dev/nvidia{minor}"
    slot = ids.slot(node)
    if slot is not None:
        return (slot,) if slot in slots else ()
    return slots if ids.unresolvable(node) else ()


def slot_holders(
    desired: DesiredState, observed: Observed, *, skip: Collection[str | None] = ()
) -> dict[str, list[ContainerView]]:
    """Active containers by the GPU slots they hold (containers whose id is in ``skip`` left out)."""
    ids = slot_ids(desired.host, observed)
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


def is_ours(c: ContainerView, host: str, own: Ownership) -> bool:
    return owner_kind(c, host, own) == "ours"


def describe_container(c: ContainerView) -> str:
    return f"container {c.name} ({c.id[:12]}, {c.state})"


def claimed_by(ids: SlotIds, desired: DesiredState, observed: Observed, containers: Collection[str | None]) -> set[str]:
    """The slots the active containers whose ids are in ``containers`` claim."""
    all_slots = tuple(desired.host.gpus)
    return {
        slot
        for c in observed.containers
        if c.id in containers and c.active
        for slot in claimed_slots(c, ids, all_slots, host=desired.host.name)
    }
