"""Reading /proc: each source is a read (I/O) and a parse (pure, tested on captured text).

Called by the shm observer (maps, fds, through ``holder_scan``) and the GPU observer (pid -> container through
cgroup). The holder scan's reads of a share of /proc's processes (``scan_names``) also run in worker interpreters that
run this file alone as a script (``worker_main``; started by ``holder_scan``), with no package to import from: it
imports nothing of the package at its top.
"""

from __future__ import annotations

import errno
import marshal
import os
import re
import stat as stat_mod
import sys
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

# Container ids on a cgroup path, in every form Docker, containerd, CRI-O and Podman write (tests/data/cgroup holds
# captured and documented examples). One path segment names one container:
#   Docker, cgroupfs driver (v1 or v2):  /docker/<id>
#   Docker, systemd driver:              /system.slice/docker-<id>.scope  (rootless: .../user@1000.service/
#                                          user.slice/docker-<id>.scope; Docker in Docker on v2: .../<id>/init)
#   containerd CRI, systemd driver:      /kubepods.slice/.../kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope
#   containerd / kubelet, cgroupfs:      /kubepods/burstable/pod<uid>/<id>
#   kubelet systemd driver over a cgroupfs runtime: .../kubepods-burstable-pod<uid>.slice:cri-containerd:<id>
#   nerdctl (containerd without CRI):    /default/<id>  or  /system.slice/nerdctl-<id>.scope
#   CRI-O:                               crio-<id>.scope
#   Podman, systemd manager:             /machine.slice/libpod-<id>.scope[/container]  (rootless: .../user@1000.service/
#                                          user.slice/libpod-<id>.scope/container; in a pod: machine-libpod_pod_<pod>.slice/)
#   Podman, cgroupfs manager:            /libpod_parent/libpod-<id>  (no .scope; in a pod: /libpod_parent/<pod>/libpod-<id>)
# A container's monitor (crio-conmon-<id>.scope, libpod-conmon-<id>.scope, /libpod_parent/conmon) is not the
# container; a pod uid, a systemd session or a sandbox's 32-hex cgroup never matches. A Podman pod's bare 64-hex
# cgroup is a candidate like any other, and never the answer: the engine lists no container by a pod's id. A nested engine puts its containers below the
# container it runs in (Docker in Docker: /docker/<outer>/docker/<inner>; kind: /system.slice/docker-<node>.scope/
# kubelet.slice/.../cri-containerd-<id>.scope), so one path can name several ids, outermost first.
_HEX64 = r"([0-9a-f]{64})"
_CGROUP_SEGMENT = re.compile(
    rf"{_HEX64}|(?:docker|cri-containerd|crio|libpod|nerdctl)-{_HEX64}\.scope|libpod-{_HEX64}"
    rf"|[^:]+:(?:cri-containerd|crio|docker):{_HEX64}"
)


def parse_cgroup_container_ids(text: str) -> tuple[str, ...]:
    """Pure: every container id candidate on the cgroup paths of a /proc/PID/cgroup text, innermost first.

    No candidate: a host process. Which candidate is the process's container depends on the engine asked:
    ``innermost_known`` picks the innermost one the engine lists. Across the lines of cgroup v1 (one per
    hierarchy) an id counts at its deepest position, so an inner engine that created cgroups in only some
    hierarchies still comes first.
    """
    depth: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = 0
        for segment in parts[2].split("/"):
            m = _CGROUP_SEGMENT.fullmatch(segment)
            if m is None:
                continue
            cid = m.group(1) or m.group(2) or m.group(3) or m.group(4)
            depth[cid] = max(depth.get(cid, found), found)
            found += 1
    # Deepest first; equal depths keep the order they were met in.
    return tuple(sorted(depth, key=lambda cid: -depth[cid]))


def innermost_known(candidates: Sequence[str], known: Container[str]) -> str | None:
    """Pure: the innermost candidate the engine knows (its container list), or None.

    An id the engine does not list is no container of it: the outer container of an engine that itself runs in
    a container, a container of another runtime, or a nested engine's container inside one of ours (then the
    one of ours, further out, is the answer).
    """
    for cid in candidates:
        if cid in known:
            return cid
    return None


def read_cgroup(pid: int, proc_root: str = "/proc") -> str | None:
    """The raw /proc/PID/cgroup text, or None when the process is gone or unreadable."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def container_candidates_of_pid(pid: int, proc_root: str = "/proc") -> tuple[str, ...]:
    """The container id candidates of a pid, innermost first; () for a host process, or one gone or unreadable."""
    text = read_cgroup(pid, proc_root)
    return parse_cgroup_container_ids(text) if text else ()


def container_of_pid(pid: int, known: Container[str], proc_root: str = "/proc") -> str | None:
    """The id of the innermost container on a pid's cgroup path that ``known`` (the engine's list) holds."""
    return innermost_known(container_candidates_of_pid(pid, proc_root), known)


def read_comm(pid: int, proc_root: str = "/proc") -> str:
    """A short human name for a pid: its cmdline (secret values masked), else its comm; '' when gone."""
    # start-up: the scan's worker interpreters run this file alone (-I -S, no package): it imports none at the top
    from reconciler.base.redact import redact_argv

    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as fh:
            raw = fh.read(4096)
        if raw:
            # Masked before it is cut to 200 characters, so a cut never splits a flag from its secret value.
            return " ".join(redact_argv(raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")))[:200]
        with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return f"[{fh.read().strip()}]"
    except OSError:
        return ""


# ---------------------------------------------------------------- /proc/PID/maps and /proc/PID/fd
#
# Who holds a file on the offload tmpfs: a live process that maps it (a line of /proc/PID/maps) or holds it open
# (an entry of /proc/PID/fd). Both are matched by device and inode, never by path text: a container sees the same
# file under another path, and a mapped file may already be unlinked. ``holder_scan.scan_holders`` is the hot
# path the shm guard runs twice per reclaim; ``parse_maps`` is its pure half, tested on captured text.

# A card's node, whatever its path: character 195:N for card N (nvidiactl is 255, nvidia-modeset 254: no cards).
NVIDIA_MAJOR = 195
NVIDIA_CARD_MINORS = range(254)

_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})
_MAPS_READ_CHUNK = 1 << 17  # procfs hands out about one page per read; a larger buffer costs nothing
_DELETED = b" (deleted)"


@dataclass(frozen=True, slots=True)
class MapRecord:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    dev_major: int
    dev_minor: int
    inode: int
    # As the kernel printed it, with " (deleted)" removed and "\\012" turned back into a newline. Informational:
    # the path is relative to the reader's root and can be ambiguous; ownership is decided by device and inode.
    path: str
    deleted: bool

    @property
    def dev(self) -> int:
        return os.makedev(self.dev_major, self.dev_minor)

    @property
    def length(self) -> int:
        return self.end - self.start


def dev_token(dev: int) -> bytes:
    """How a device appears in a maps line, with the separating blanks: the kernel prints it as "%02x:%02x"."""
    return b" %02x:%02x " % (os.major(dev), os.minor(dev))


def parse_maps_line(line: bytes) -> MapRecord | None:
    """Pure: one maps line -> MapRecord; None for a line that is not one (a truncated read's last line)."""
    parts = line.rstrip(b"\n").split(None, 5)
    if len(parts) < 5:
        return None
    try:
        lo, _, hi = parts[0].partition(b"-")
        major, _, minor = parts[3].partition(b":")
        start, end = int(lo, 16), int(hi, 16)
        offset, dev_major, dev_minor = int(parts[2], 16), int(major, 16), int(minor, 16)
        inode = int(parts[4])
    except ValueError:
        return None
    raw = parts[5] if len(parts) == 6 else b""
    deleted = raw.endswith(_DELETED)
    if deleted:
        raw = raw[: -len(_DELETED)]
    # The kernel escapes a newline in a path as \012 (and nothing else), so one maps line is one mapping.
    path = os.fsdecode(raw.replace(b"\\012", b"\n"))
    return MapRecord(
        start, end, parts[1].decode("ascii", "replace"), offset, dev_major, dev_minor, inode, path, deleted
    )


def parse_maps(text: bytes, *, dev: int | None = None) -> list[MapRecord]:
    """Pure: the mappings in a maps text; with ``dev``, only those of that device.

    With ``dev`` the text is first searched for the device as printed (a C-level substring search over the
    whole text), and only the lines around each hit are split: the usual process maps nothing on the tmpfs
    and costs one search. A hit inside a path name is ruled out by the parsed device.
    """
    if dev is None:
        return [r for r in map(parse_maps_line, text.splitlines()) if r is not None]
    token = dev_token(dev)
    out: list[MapRecord] = []
    pos = text.find(token)
    while pos >= 0:
        line_start = text.rfind(b"\n", 0, pos) + 1
        line_end = text.find(b"\n", pos)
        if line_end < 0:
            line_end = len(text)
        rec = parse_maps_line(text[line_start:line_end])
        if rec is not None and rec.dev == dev:
            out.append(rec)
        pos = text.find(token, line_end)
    return out


def maps_on_dev(text: bytes, dev: int, token: bytes | None = None) -> tuple[set[int], list[MapRecord]]:
    """Pure, the scan's hot path: the inodes a maps text maps on ``dev``, and the full records of those
    mappings whose file was unlinked (" (deleted)"), the only ones whose details are needed.

    Same answer as ``parse_maps(text, dev=dev)`` (a test holds them equal) for a fraction of the work: a hit is
    the device field exactly when the three fields before it on its line are separated by single blanks, as
    the kernel prints them ("start-end perms offset"); a device-like text inside a path has more before it.
    """
    token = token or dev_token(dev)
    inodes: set[int] = set()
    unlinked: list[MapRecord] = []
    find, rfind = text.find, text.rfind
    pos = find(token)
    while pos >= 0:
        start = rfind(b"\n", 0, pos) + 1
        end = find(b"\n", pos)
        if end < 0:
            end = len(text)
        if text.count(b" ", start, pos) == 2:
            ino_text, _, rest = text[pos + len(token) : end].partition(b" ")
            if ino_text.isdigit():
                inodes.add(int(ino_text))
                if rest.endswith(_DELETED):
                    rec = parse_maps_line(text[start:end])
                    if rec is not None:
                        unlinked.append(rec)
        pos = find(token, end)
    return inodes, unlinked


def read_proc_bytes(path: str) -> bytes:
    """The whole content of a /proc file. Raises OSError (ENOENT/ESRCH when the process is gone)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _MAPS_READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class FdTarget:
    """An open file descriptor of a process whose file lies on the scanned device."""

    fd: int
    inode: int
    size: int
    allocated: int  # st_blocks * 512
    nlink: int  # 0: the file was unlinked and lives on through this descriptor


def _is_card(st: os.stat_result) -> bool:
    return stat_mod.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) in NVIDIA_CARD_MINORS


def read_fd_targets(fd_dir: str, dev: int, cards: set[int] | None = None) -> list[FdTarget]:
    """The descriptors in a /proc/PID/fd directory that point at files on ``dev``; with ``cards``, the minor N of
    each card node (195:N) it holds open is added to it.

    Each descriptor is stat'ed through its magic link (one syscall, relative to the opened directory): that
    reaches the open file itself, whatever path it was opened under (so a card's node is known by its number,
    at no further call). A descriptor closed meanwhile is skipped; any other error is raised, so the caller can
    call the process uninspectable.
    """
    dfd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        out: list[FdTarget] = []
        stat, major = os.stat, os.major
        for name in os.listdir(dfd):
            try:
                st = stat(name, dir_fd=dfd)
            except FileNotFoundError:
                continue  # closed between the listing and the stat
            if st.st_dev == dev:
                out.append(FdTarget(int(name), st.st_ino, st.st_size, st.st_blocks * 512, st.st_nlink))
            # Most descriptors have no device number (files, sockets, pipes): one test; /dev/null and ttys two.
            if st.st_rdev and major(st.st_rdev) == NVIDIA_MAJOR and cards is not None and _is_card(st):
                cards.add(os.minor(st.st_rdev))
        return out
    finally:
        os.close(dfd)


@dataclass
class HolderScan:
    """What one pass over /proc found on one device: mapped inodes and open descriptors per pid."""

    dev: int
    pids_scanned: int = 0
    mapped: dict[int, set[int]] = field(default_factory=dict)  # pid -> inodes it maps on the device
    # pid -> its mappings of files on the device that were already unlinked (" (deleted)" in maps).
    unlinked_maps: dict[int, list[MapRecord]] = field(default_factory=dict)
    fds: dict[int, list[FdTarget]] = field(default_factory=dict)
    # pid -> why its maps or fds could not be read (not because it exited): the scan is incomplete for it.
    unreadable: dict[int, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # pid -> its start time (/proc/PID/stat, clock ticks since boot) when it was read: a pid listed again with
    # another start time is a new process under a reused number, and is read again.
    seen: dict[int, int] = field(default_factory=dict)
    rounds: int = 1  # listings of /proc that were read from: one more after each round that lost a process
    # pids listed but gone before they were read, or read with their memory already gone (exiting, a zombie): what
    # they held is not known, and a child they forked after the listing may hold it (``proc_settle``).
    lost: list[int] = field(default_factory=list)  # a list: a reused number can be lost twice
    # Why the scan did not settle (listed processes kept vanishing unread for 16 listings: ``proc_settle``): incomplete.
    unstable: str = ""
    workers: int = 1  # processes that shared the scan, this one included
    # pid -> the cards whose node it holds open (195:N): usable before NVML lists it (with a CUDA context).
    cards: dict[int, set[int]] = field(default_factory=dict)
    worker_failures: int = 0  # workers whose share was scanned here instead (no answer, or a bad one)

    def holders(self) -> dict[int, list[tuple[int, str]]]:
        """inode -> [(pid, "map"|"fd")], each pid once per way, mappings first."""
        out: dict[int, list[tuple[int, str]]] = {}
        for pid, inodes in self.mapped.items():
            for ino in sorted(inodes):
                out.setdefault(ino, []).append((pid, "map"))
        for pid, fds in self.fds.items():
            for ino in dict.fromkeys(f.inode for f in fds):
                out.setdefault(ino, []).append((pid, "fd"))
        return out


def _why(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror or exc}"


# What reading one process found: gone (before its maps could be read), its memory gone already (empty maps: a
# kernel thread, a zombie, a process exiting), or read.
_GONE, _NO_MEMORY, _READ = 0, 1, 2


def _scan_task(base: str, pid: int, dev: int, token: bytes, scan: HolderScan) -> int:
    """Scan one process (or thread) directory: ``_GONE``, ``_NO_MEMORY`` or ``_READ``."""
    try:
        text = read_proc_bytes(base + "/maps")
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return _GONE
        scan.unreadable[pid] = _why(exc)
        text = b""
    # Most processes map nothing on the device: one substring search decides, no line is split.
    if token in text:
        inodes, unlinked = maps_on_dev(text, dev, token)
        if inodes:
            scan.mapped.setdefault(pid, set()).update(inodes)
        if unlinked:
            scan.unlinked_maps.setdefault(pid, []).extend(unlinked)
    cards: set[int] = set()
    try:
        fds = read_fd_targets(base + "/fd", dev, cards)
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return _READ if text else _GONE
        scan.unreadable.setdefault(pid, _why(exc))
        return _READ
    if fds:
        scan.fds.setdefault(pid, []).extend(fds)
    if cards:
        scan.cards.setdefault(pid, set()).update(cards)
    if text or pid in scan.unreadable:
        return _READ
    # Empty maps: a kernel thread, a zombie, a process exiting, or a thread-group leader that exited while its other
    # threads run on with the memory and descriptors. Only the last holds anything; look at its threads.
    if not fds and _scan_threads(base, pid, dev, token, scan):
        return _READ
    return _NO_MEMORY


def _scan_threads(base: str, pid: int, dev: int, token: bytes, scan: HolderScan) -> bool:
    """Scan the other threads of a leader whose maps were empty; True when one of them had memory to read."""
    try:
        tids = [t for t in os.listdir(base + "/task") if t != str(pid)]
    except OSError:
        return False  # gone, or a kernel thread without a readable task list: nothing mapped either way
    found = [_scan_task(f"{base}/task/{tid}", pid, dev, token, scan) for tid in tids]
    return _READ in found


_PF_KTHREAD = 0x00200000  # a kernel thread (flags, field 9 of /proc/PID/stat): it never has memory of its own


def read_stat(pid: int, proc_root: str = "/proc") -> tuple[int, bool] | None:
    """A process's start time (field 22 of /proc/PID/stat, clock ticks after boot) and whether it is a kernel thread;
    None when it is gone, a start time of -1 when its stat cannot be read or parsed.

    With the pid the start time names one process for the life of the system: a pid number is reused, a start time
    with it is not (two processes started in one tick under one pid number would need the whole pid space in a tick).
    """
    try:
        raw = read_proc_bytes(f"{proc_root}/{pid}/stat")
    except OSError as exc:
        # Unreadable for another reason: read its maps all the same (their error decides); -1, not known.
        return None if exc.errno in _GONE_ERRNOS else (-1, False)
    # The command (field 2) is in parentheses and may hold anything, ')' and blanks included: split after it.
    fields = raw.rpartition(b")")[2].split()
    try:
        start = int(fields[19])
    except (IndexError, ValueError):
        return -1, False
    return start, fields[6].isdigit() and bool(int(fields[6]) & _PF_KTHREAD)


def scan_names(names: list[str], dev: int, proc_root: str, scan: HolderScan) -> None:
    token = dev_token(dev)
    for name in names:
        pid = int(name)
        # Read before its maps: a number reused after this read shows another start time at the next listing.
        stat = read_stat(pid, proc_root)
        if stat is None:
            scan.lost.append(pid)  # listed, gone before it was read
            continue
        start, kernel = stat
        scan.seen[pid] = start
        got = _scan_task(f"{proc_root}/{name}", pid, dev, token, scan)
        if got == _GONE or (got == _NO_MEMORY and not kernel):
            # What it held is not known: gone, or its memory already gone (exiting, a zombie) when it was read.
            scan.lost.append(pid)
        if got != _GONE:
            scan.pids_scanned += 1


WORKER_FLAG = "--scan-holders-worker"
WORKER_SCRIPT = os.path.abspath(__file__)  # what a worker interpreter runs, alone


def worker_main(argv: list[str]) -> int:
    """A scan worker: pid names on stdin, its part of a HolderScan on stdout (marshal; same interpreter), read back
    by ``holder_scan``'s ``_collect_worker`` in the order written here."""
    dev, proc_root = int(argv[0]), argv[1]
    names = sys.stdin.buffer.read().decode().split()
    scan = HolderScan(dev=dev)
    scan_names(names, dev, proc_root, scan)
    payload = (
        scan.pids_scanned,
        [(pid, list(inodes)) for pid, inodes in scan.mapped.items()],
        [
            (
                pid,
                [
                    (r.start, r.end, r.perms, r.offset, r.dev_major, r.dev_minor, r.inode, r.path, r.deleted)
                    for r in recs
                ],
            )
            for pid, recs in scan.unlinked_maps.items()
        ],
        [(pid, [(f.fd, f.inode, f.size, f.allocated, f.nlink) for f in items]) for pid, items in scan.fds.items()],
        list(scan.unreadable.items()),
        list(scan.seen.items()),
        [(pid, list(minors)) for pid, minors in scan.cards.items()],
        scan.lost,
    )
    sys.stdout.buffer.write(marshal.dumps(payload))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == WORKER_FLAG:
        raise SystemExit(worker_main(sys.argv[2:]))
    raise SystemExit(f"usage: {sys.argv[0]} {WORKER_FLAG} DEV PROC_ROOT  (pid names on stdin)")
