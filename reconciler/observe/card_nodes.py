"""Who holds a card's device node open: the holders the /proc scan of every pass found (``procfs.HolderScan.cards``,
read from the same stat of each descriptor the shm guard makes), each named by pid, container and command.

A process that opened ``/dev/nvidiaN`` (or any node numbered 195:N) can use card N whatever its container's
configuration says, and NVML lists it only once it has a CUDA context: an idle holder has none. Two kinds of
process are left out, as none of them runs work on a card: this process itself (NVML's own reads open every
card's node), and the driver's own services on the host, outside any container (``DRIVER_SERVICES``: the
persistence daemon keeps every card's node open for as long as it runs, DCGM's host engine and ``nvidia-smi`` read
through NVML). Called by ``reconciler.observe.shm.inspect_shm``. docs/design.md, safety rule 11.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from reconciler.observe.procfs import container_candidates_of_pid, innermost_known
from reconciler.plan.observed import NodeHolder

# Host processes of NVIDIA's driver and tools that hold card nodes open without running work on them (their comm).
DRIVER_SERVICES = frozenset({"nvidia-persistenced", "nv-hostengine", "nvidia-smi"})


def read_comm_name(pid: int, proc_root: str = "/proc") -> str:
    """A process's comm (/proc/PID/comm), '' when gone."""
    try:
        with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def card_holders(
    cards: Mapping[int, set[int]],
    names: Mapping[str, str],
    *,
    container_of: Callable[[int], str | None],
    command_of: Callable[[int], str],
    proc_root: str = "/proc",
    own_pid: int | None = None,
) -> tuple[NodeHolder, ...]:
    """The holders of card nodes (pid -> card minors, as the scan read them), each with the engine's container it
    runs in (``names``: the engine's containers, id -> name) and a command line; ``container_of`` and
    ``command_of`` are the scan's resolver's (cached per pid)."""
    me = os.getpid() if own_pid is None else own_pid
    out: list[NodeHolder] = []
    for pid in sorted(cards):
        if pid == me:
            continue
        candidates = container_candidates_of_pid(pid, proc_root)
        if not candidates and read_comm_name(pid, proc_root) in DRIVER_SERVICES:
            continue
        cid = innermost_known(candidates, names)
        where = container_of(pid)
        command = command_of(pid)
        out.extend(NodeHolder(pid, minor, cid, where, command) for minor in sorted(cards[pid]))
    return tuple(out)
