"""The holder scan of one device (docs/design.md, safety rule 2): every live process's mappings and open descriptors
on the offload tmpfs (``scan_holders``), read by ``procfs``, shared on a busy host between this process and worker
interpreters that run ``procfs``'s file as a script, and listed again until no listing lost a process
(``proc_settle``). Called by the shm observer (``reconciler.observe.shm``).
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import time

from reconciler.observe.proc_settle import settle_scan
from reconciler.observe.procfs import WORKER_FLAG, WORKER_SCRIPT, FdTarget, HolderScan, MapRecord, read_stat, scan_names

# Below this many processes one process scans alone: starting a worker (~15 ms) would cost more than it saves.
PARALLEL_MIN_PIDS = 600
MAX_WORKERS = 4


def default_workers(n_pids: int) -> int:
    """How many processes share a scan: one per usable CPU, at most MAX_WORKERS, one per PARALLEL_MIN_PIDS pids.

    Measured on 2 CPUs with 2,000 busy processes: 0.36 s with two against 0.57 s with one when a CPU is
    free, and about 10% slower than one when other work saturates both. The load average is no guide to
    which case holds (it counts tasks waiting on I/O), so the CPU count decides; serving hosts have many,
    mostly idle while the GPUs work.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS, n_pids // PARALLEL_MIN_PIDS))


def scan_holders(dev: int, *, proc_root: str = "/proc", workers: int | None = None) -> HolderScan:
    """Every live process's mappings and open descriptors on device ``dev``.

    A process that exits during the scan is simply gone. One whose maps or fd directory cannot be read for any
    other reason is recorded in ``unreadable``: the caller must treat the scan as incomplete for it, as it must
    an ``unstable`` one (``proc_settle.settle_scan``: /proc is listed again while a listing loses a process unread).
    Raises OSError when ``proc_root`` itself cannot be listed.

    Reading maps is kernel work (the kernel formats every mapping of every process), and Python threads do
    not spread it over CPUs: each of the many short syscalls hands the GIL back and forth. So on a busy host
    the pid list is split between this process and ``workers - 1`` child interpreters running ``procfs``'s file
    as a script (stdlib only, started in ~15 ms, never forked from a possibly threaded caller). Each gets its
    share of the pids from one listing, so no pid is missed between listings; a worker that fails to start
    or answer has its share scanned here instead, so parallelism never changes the answer.
    """
    t0 = time.perf_counter()
    names = [n for n in os.listdir(proc_root) if n.isdigit()]
    n = default_workers(len(names)) if workers is None else max(1, min(workers, len(names) or 1))
    shards = [names[i::n] for i in range(n)]
    children = [_start_worker(dev, proc_root, shard) for shard in shards[1:]]
    scan = HolderScan(dev=dev, workers=n)
    scan_names(shards[0], dev, proc_root, scan)
    for shard, child in zip(shards[1:], children, strict=True):
        if child is None or not _collect_worker(child, scan):
            scan.worker_failures += 1
            scan_names(shard, dev, proc_root, scan)
    settle_scan(
        scan,
        list_pids=lambda: [n for n in os.listdir(proc_root) if n.isdigit()],
        start_time=lambda pid: (read_stat(pid, proc_root) or (None, False))[0],
        scan_names=lambda more, into: scan_names(more, dev, proc_root, into),
    )
    scan.elapsed_s = time.perf_counter() - t0
    return scan


def _start_worker(dev: int, proc_root: str, names: list[str]) -> subprocess.Popen[bytes] | None:
    if not sys.executable:
        return None
    try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", WORKER_SCRIPT, WORKER_FLAG, str(dev), proc_root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert child.stdin is not None
        # A few KiB of pid names: fits the pipe buffer, so this never waits for the child.
        child.stdin.write(" ".join(names).encode())
        child.stdin.close()
        child.stdin = None  # closed: communicate() must not flush it
        return child
    except OSError:
        return None


def _collect_worker(child: subprocess.Popen[bytes], scan: HolderScan) -> bool:
    """Merge a worker's answer (the tuple ``procfs.worker_main`` writes) into ``scan``; False (and nothing merged)
    when it did not answer in full."""
    try:
        out, _ = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return False
    if child.returncode != 0:
        return False
    try:
        scanned, mapped, unlinked, fds, unreadable, seen, cards, lost = marshal.loads(out)
    except (EOFError, ValueError, TypeError):
        return False
    scan.pids_scanned += scanned
    for pid, inodes in mapped:
        scan.mapped.setdefault(pid, set()).update(inodes)
    for pid, recs in unlinked:
        scan.unlinked_maps.setdefault(pid, []).extend(MapRecord(*r) for r in recs)
    for pid, items in fds:
        scan.fds.setdefault(pid, []).extend(FdTarget(*f) for f in items)
    for pid, why in unreadable:
        scan.unreadable.setdefault(pid, why)
    scan.seen.update(seen)
    for pid, minors in cards:
        scan.cards.setdefault(pid, set()).update(minors)
    scan.lost.extend(lost)
    return True
