"""The cards a container's device cgroup rules give it (``docker run --device-cgroup-rule``), read with the card nodes
it can reach: bound in (``-v /dev/nvidia1:/dev/nvidia1``, ``-v /dev:/dev``) or made inside with ``mknod``.

A rule alone opens nothing: a process opens a card through its node, ``/dev/nvidiaN`` (character major 195, minor
N). Docker's default device rules let any container make a node (``c *:* m``) and its default capabilities include
CAP_MKNOD, so a rule that allows reading or writing 195:N gives card N to every container that keeps CAP_MKNOD, and
to one that has the node bound in. ``/dev/nvidiactl`` (195:255), ``/dev/nvidia-modeset`` (195:254) and
``/dev/nvidia-uvm`` (its own major, given at load: ``/proc/devices`` names it) are no cards; a rule that reaches only
them reaches no card.

Pure, but ``read_proc_devices``: called by ``reconciler.observe.containers`` (``gpu_devices_of``), and tested on
captured engine answers and a ``/proc/devices`` text. docs/design.md, safety rule 11.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reconciler.observe.procfs import NVIDIA_CARD_MINORS, NVIDIA_MAJOR

# The id of a container that may open every card's node through a device cgroup rule (a node bound in that could
# be any card's, /dev bound in, or CAP_MKNOD to make one): it holds every slot, as --privileged does.
DEVICE_RULE = "device-rule"

# A rule as the kernel's devices controller takes it, and Docker checks it: TYPE MAJOR:MINOR ACCESS; "a" alone is
# every device (cgroup v1's devices.allow).
_RULE = re.compile(r"^([abc])\s+(\d+|\*):(\d+|\*)\s+([rwm]{1,3})$")
_CARD_NODE = re.compile(r"^/dev/nvidia(\d{1,3})$")
# Where every node of the host is: the host's /dev, or a directory above it.
_EVERY_NODE = ("/", "/dev")
_CARD_NAMES = ("nvidia", "nvidia-frontend")  # the card's major in /proc/devices, by driver version

# What a rule or a set of rules reaches of the cards: the card minors, or None for every card.
Reach = frozenset[int] | None


def parse_proc_devices(text: str) -> dict[str, int]:
    """Pure: the character devices of a ``/proc/devices`` text, name -> major (the first major given a name)."""
    out: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        head = line.strip()
        if head.endswith(":"):
            in_char = head == "Character devices:"
            continue
        major, _, name = head.partition(" ")
        if in_char and major.isdigit() and name:
            out.setdefault(name.strip(), int(major))
    return out


def nvidia_majors(text: str) -> tuple[frozenset[int], int | None]:
    """Pure: the majors of NVIDIA's card nodes (always 195, the driver's fixed number, and any other /proc/devices
    gives the card driver) and of ``nvidia-uvm`` (None where the module is not loaded), from a /proc/devices text."""
    devices = parse_proc_devices(text)
    cards = {NVIDIA_MAJOR, *(devices[n] for n in _CARD_NAMES if n in devices)}
    return frozenset(cards), devices.get("nvidia-uvm")


def read_proc_devices(proc_root: str = "/proc") -> str:
    """The /proc/devices text ('' when it cannot be read: the cards' major is still NVIDIA's fixed 195)."""
    try:
        with open(f"{proc_root}/devices", encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def rule_reach(rule: str, card_majors: Iterable[int] = (NVIDIA_MAJOR,)) -> Reach:
    """Pure: the card minors one device cgroup rule lets a process open (read or write); None: every card.

    A block device, another major (``nvidia-uvm``'s included) or a rule that allows only ``m`` (make the node,
    never open it) reaches none. A rule that cannot be read may be any: every card (fail closed)."""
    text = " ".join(rule.split())
    if text == "a":
        return None
    m = _RULE.match(text)
    if m is None:
        return None
    kind, major, minor, access = m.groups()
    if kind == "b" or not ({"r", "w"} & set(access)):
        return frozenset()
    if major != "*" and int(major) not in set(card_majors):
        return frozenset()
    if minor == "*":
        return None
    return frozenset({int(minor)} & set(NVIDIA_CARD_MINORS))


def rules_reach(rules: Iterable[Any], card_majors: Iterable[int] = (NVIDIA_MAJOR,)) -> Reach:
    """Pure: what a container's rules reach together (``rule_reach`` of each)."""
    majors = tuple(card_majors)
    minors: set[int] = set()
    for rule in rules:
        one = rule_reach(str(rule), majors)
        if one is None:
            return None
        minors |= one
    return frozenset(minors)


def can_mknod(host_config: Mapping[str, Any], effective: Sequence[str] | None = None) -> bool:
    """Pure: whether a container keeps CAP_MKNOD. ``effective``: the capabilities the engine says it has (Podman's
    ``EffectiveCaps``), which decide; else Docker's default set, which has it, less ``CapDrop`` (``MKNOD`` or
    ``ALL``) unless ``CapAdd`` gives it back."""

    def names(key: str) -> set[str]:
        return {str(c).upper().removeprefix("CAP_") for c in host_config.get(key) or []}

    if effective is not None:
        return "MKNOD" in {str(c).upper().removeprefix("CAP_") for c in effective}
    dropped = names("CapDrop") & {"MKNOD", "ALL"}
    return not dropped or "MKNOD" in names("CapAdd")


def bind_pairs(inspect: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Pure: every (path on the host, path in the container) a container has bound in: ``HostConfig.Binds``
    (``SRC:DST[:OPTS]``), and the bind mounts of ``HostConfig.Mounts`` and of the inspect's own ``Mounts``."""
    host_config = inspect.get("HostConfig") or {}
    out: list[tuple[str, str]] = []
    for bind in host_config.get("Binds") or []:
        src, _, rest = str(bind).partition(":")
        out.append((src, rest.partition(":")[0]))
    for mounts, target in ((host_config.get("Mounts"), "Target"), (inspect.get("Mounts"), "Destination")):
        for m in mounts or []:
            if isinstance(m, Mapping) and str(m.get("Type") or "bind") == "bind":
                out.append((str(m.get("Source") or ""), str(m.get(target) or "")))
    return out


def bound_card_nodes(binds: Iterable[tuple[str, str]], by_number: Iterable[str] = ()) -> list[str] | None:
    """Pure: the card nodes bound into a container (``/dev/nvidiaN`` by the name on either side, or by the device
    number the observer read of the path on the host, ``by_number``); None when /dev, or a directory above it, is
    bound in: every node of the host is in it."""
    nodes = list(by_number)
    for src, dst in binds:
        if (src.rstrip("/") or "/") in _EVERY_NODE:
            return None
        for path in (src, dst):
            m = _CARD_NODE.match(path)
            if m is not None and int(m.group(1)) in NVIDIA_CARD_MINORS:
                nodes.append(path)
    return list(dict.fromkeys(nodes))


def rule_cards(inspect: Mapping[str, Any]) -> list[str] | None:
    """Pure: the card nodes a container's device cgroup rules let it open (``/dev/nvidiaN``, resolved to slots as
    ``--device`` nodes are), or None for every card: the rules reach a card whose node is bound in, or every card
    when /dev is bound in or CAP_MKNOD lets it make any node. Reads ``HostConfig.DeviceCgroupRules``, the binds
    (``bind_pairs``), ``CapAdd``/``CapDrop`` (or ``EffectiveCaps``), and what the observer added: ``BoundNodes``
    (the card nodes among the bound paths, by device number) and ``CardMajors`` (``nvidia_majors``)."""
    host_config = inspect.get("HostConfig") or {}
    rules = host_config.get("DeviceCgroupRules") or []
    if not rules:
        return []
    reach = rules_reach(rules, inspect.get("CardMajors") or (NVIDIA_MAJOR,))
    if reach is not None and not reach:
        return []
    caps = inspect.get("EffectiveCaps")
    bound = bound_card_nodes(bind_pairs(inspect), inspect.get("BoundNodes") or ())
    if bound is None or can_mknod(host_config, caps if isinstance(caps, list) else None):
        # Every node is in it, or can be: the rules decide which cards.
        return None if reach is None else [f"/dev/nvidia{n}" for n in sorted(reach)]
    return [n for n in bound if reach is None or int(n.removeprefix("/dev/nvidia")) in reach]
