"""The offload files in ``shm.dir`` and who holds them: ``inspect_shm(cfg, containers=..., docker=...) -> ShmView``.

Read-only. Called by ``reconciler.observe.observe`` (every pass), by ``reconciler shm status`` and, twice per
reclaim, by ``reconciler.apply.shm_guard.reclaim``. It applies the safety rules 1-3 of docs/design.md:

1. Only entries of ``shm.dir`` whose name matches ``shm.pattern`` exactly are looked at, each with ``lstat``
   relative to the opened directory: a symlink, a directory, anything not a regular file, a mount on top of
   an entry (another device) and a file with more than one hard link (another name elsewhere may be in use)
   are listed as skipped, never as candidates.
2. A file is owned when a live process maps it or holds it open, matched by device and inode
   (``holder_scan.scan_holders``), never by path text. While a running container with native offload configured
   could own an unowned file, that file is ``blocked``, not ``orphan``: every such container could, except one
   that is settled (recorded healthy by this install: its model loaded, its offload file made) and seen holding
   a file of the tmpfs in this very inspection (its file is accounted for: an unowned one is not its).
3. Fail closed: when /proc cannot be read completely (an uninspectable process not excused by
   ``shm.ignore_uninspectable_pids``) or Docker did not answer, no file is ``orphan``; the unowned ones are
   ``blocked`` with the source named, and the view's source says why.

The I/O (listing the directory, scanning /proc, statvfs) and the decision (``build_view``, pure) are split so
the decision is testable on plain values.
"""

from __future__ import annotations

import fnmatch
import os
import stat as st_mode
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from reconciler.base.redact import redact_argv
from reconciler.observe.card_nodes import card_holders
from reconciler.observe.holder_scan import scan_holders
from reconciler.observe.procfs import HolderScan, innermost_known, parse_cgroup_container_ids, read_comm
from reconciler.observe.shapes import status_json
from reconciler.plan.observed import (
    ContainerView,
    NodeHolder,
    Owner,
    Reading,
    ShmFile,
    ShmView,
    Tmpfs,
    Uninspectable,
)

if TYPE_CHECKING:
    from reconciler.model import ShmConfig

HOST_FILE = "configs/host.yaml"


class ShmSettings(Protocol):
    """The fields of ``ShmConfig`` this module reads (so the bench can run it without pydantic)."""

    dir: str
    pattern: str
    ignore_uninspectable_pids: list[int]


@dataclass(frozen=True)
class DirEntry:
    """One name in ``shm.dir`` that matched the pattern, with its lstat."""

    name: str
    mode: int
    dev: int
    inode: int
    size: int
    allocated: int
    nlink: int
    link_target: str = ""  # for a symlink: where it points (shown, never followed)


@dataclass(frozen=True)
class DirListing:
    dir_dev: int
    entries: tuple[DirEntry, ...]
    tmpfs: Tmpfs


def list_dir(cfg: ShmSettings) -> DirListing:
    """The pattern-matching entries of ``shm.dir`` (lstat'ed through the opened directory) and its statvfs.

    Raises OSError when the directory cannot be opened or listed.
    """
    dfd = os.open(cfg.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dst = os.fstat(dfd)
        vfs = os.statvfs(dfd)
        entries: list[DirEntry] = []
        for name in os.listdir(dfd):
            if not fnmatch.fnmatchcase(name, cfg.pattern):
                continue
            try:
                s = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the listing
            target = ""
            if st_mode.S_ISLNK(s.st_mode):
                try:
                    target = os.readlink(name, dir_fd=dfd)
                except OSError:
                    target = "?"
            entries.append(
                DirEntry(name, s.st_mode, s.st_dev, s.st_ino, s.st_size, s.st_blocks * 512, s.st_nlink, target)
            )
    finally:
        os.close(dfd)
    tmpfs = Tmpfs(
        size_bytes=vfs.f_blocks * vfs.f_frsize,
        used_bytes=(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
        free_bytes=vfs.f_bavail * vfs.f_frsize,
    )
    return DirListing(dst.st_dev, tuple(sorted(entries, key=lambda e: e.name)), tmpfs)


def refusal(entry: DirEntry, dir_dev: int) -> str | None:
    """Pure: why a pattern-matching entry is never a candidate, or None when it is a plain file of the dir."""
    if st_mode.S_ISLNK(entry.mode):
        return f"a symlink (to {entry.link_target!r}): never followed, never removed"
    if st_mode.S_ISDIR(entry.mode):
        return "a directory: only regular files are offload files"
    if not st_mode.S_ISREG(entry.mode):
        return "not a regular file"
    if entry.dev != dir_dev:
        return "on another filesystem than shm.dir (something is mounted on it)"
    if entry.nlink != 1:
        return f"has {entry.nlink} hard links: another name for it may be in use elsewhere"
    return None


def build_view(
    cfg: ShmSettings,
    *,
    listing: DirListing,
    holders: Mapping[int, Sequence[Owner]],
    deleted: Sequence[ShmFile],
    unreadable: Mapping[int, tuple[str, str]],
    containers: Sequence[ContainerView],
    docker: Reading,
    proc_error: str = "",
    settled: Collection[str] = (),
) -> ShmView:
    """Pure: decide owned / orphan / blocked for each entry.

    ``holders`` is inode -> the processes mapping or holding it; ``unreadable`` is pid -> (command, reason);
    ``settled`` the ids of containers this install recorded healthy (``Ownership.healthy``).
    """
    ignored = set(cfg.ignore_uninspectable_pids)
    uninspectable = tuple(
        Uninspectable(pid=pid, command=cmd, reason=why, excused=pid in ignored)
        for pid, (cmd, why) in sorted(unreadable.items())
    )
    blocking_pids = [u for u in uninspectable if not u.excused]
    if proc_error:
        proc = Reading("proc", False, proc_error)
    elif blocking_pids:
        first = blocking_pids[0]
        more = f" and {len(blocking_pids) - 1} more" if len(blocking_pids) > 1 else ""
        proc = Reading(
            "proc",
            False,
            f"pid {first.pid} ({first.command or '?'}) cannot be inspected: {first.reason}{more}; if that process "
            f"can never hold an offload file, list its pid under shm.ignore_uninspectable_pids in {HOST_FILE}",
            cause="uninspectable",
        )
    else:
        proc = Reading("proc", True)

    blocking = offload_blockers(containers, holders, settled)
    if not docker.ok:
        unowned_state, unowned_reason = (
            "blocked",
            f"docker {docker.render()}: a running offload container cannot be ruled out",
        )
    elif not proc.ok:
        unowned_state, unowned_reason = "blocked", f"proc {proc.render()}"
    elif blocking:
        unowned_state = "blocked"
        unowned_reason = (
            f"running container(s) with native offload configured: {', '.join(blocking)}; "
            "it could be making its offload file (not recorded healthy and seen holding one), so no unowned file goes"
        )
    else:
        unowned_state, unowned_reason = "orphan", "no live process maps it or holds it open"

    files: list[ShmFile] = []
    skipped: list[tuple[str, str]] = []
    for e in listing.entries:
        path = os.path.join(cfg.dir, e.name)
        why = refusal(e, listing.dir_dev)
        if why is not None:
            skipped.append((path, why))
            continue
        owners = tuple(holders.get(e.inode, ()))
        if owners:
            state, reason = "owned", describe_owners(owners)
        else:
            state, reason = unowned_state, unowned_reason
        files.append(ShmFile(path, e.dev, e.inode, e.size, e.allocated, owners, state, reason))

    return ShmView(
        dir=cfg.dir,
        pattern=cfg.pattern,
        tmpfs=listing.tmpfs,
        proc=proc,
        docker=docker,
        files=tuple(files),
        blocking_containers=blocking,
        deleted_mapped_bytes=sum(d.allocated_bytes for d in deleted),
        deleted_mapped=tuple(deleted),
        uninspectable=uninspectable,
        skipped=tuple(skipped),
    )


def unavailable_view(
    cfg: ShmSettings,
    *,
    listing: DirListing,
    containers: Sequence[ContainerView],
    docker: Reading,
    proc_error: str,
    settled: Collection[str] = (),
) -> ShmView:
    """Pure: the view of an inspection whose holders could not be known (``proc_error`` says why: the dir or /proc
    unreadable, a scan that did not settle): no file is owned and every unowned one is blocked."""
    return build_view(
        cfg,
        listing=listing,
        holders={},
        deleted=(),
        unreadable={},
        containers=containers,
        docker=docker,
        proc_error=proc_error,
        settled=settled,
    )


def offload_blockers(
    containers: Sequence[ContainerView], holders: Mapping[int, Sequence[Owner]], settled: Collection[str]
) -> tuple[str, ...]:
    """Pure: the running native-offload containers that could own a file no process holds (safety rule 2), by name.

    A container that is settled (its id in ``settled``: it passed its health check, so its engine made its
    offload file at start-up) and that one of its processes is seen holding a file of the tmpfs with does not:
    its file is the one it holds, and a file that no process holds was made by something else (another lane
    that left or died, a crashed worker). Any other running offload container could be making its file (or run
    where its processes cannot be seen), so it keeps every unowned file: a foreign one, one still starting, one
    not recorded healthy, one holding nothing.
    """
    holding = {o.container for owners in holders.values() for o in owners if o.container}
    return tuple(
        sorted(
            c.name
            for c in containers
            if c.offload and c.active and not (c.id in settled and (c.name in holding or c.id in holding))
        )
    )


# What ``Owner.container`` holds for a process whose cgroup path names containers, none of them one the engine
# lists (a container name never holds a blank, so these never read as one): the innermost id, shortened.
UNKNOWN_CONTAINER = "a container unknown to this engine: "
UNCONFIRMED_CONTAINER = "a container not confirmed (docker did not answer): "


def owner_container(candidates: Sequence[str], names: Mapping[str, str], *, engine_ok: bool) -> str | None:
    """Pure: what a holder's container is called, from its cgroup's id candidates (innermost first).

    The innermost container the engine lists, by name; an id the engine does not list is never shown as one of
    its containers. Ownership does not depend on this: a process holding a file owns it whatever its container.
    """
    if not candidates:
        return None
    cid = innermost_known(candidates, names)
    if cid is not None:
        return names[cid]
    return (UNKNOWN_CONTAINER if engine_ok else UNCONFIRMED_CONTAINER) + candidates[0][:12]


def describe_owners(owners: Sequence[Owner]) -> str:
    parts = []
    for o in owners:
        if not o.container:
            where = ""
        elif o.container.startswith((UNKNOWN_CONTAINER, UNCONFIRMED_CONTAINER)):
            where = f" in {o.container}"
        else:
            where = f" in container {o.container}"
        verb = "mapped" if o.via == "map" else "held open"
        parts.append(f"{verb} by pid {o.pid}{where}")
    return "; ".join(parts)


def inspect_shm(
    cfg: ShmConfig | ShmSettings,
    *,
    containers: Sequence[ContainerView],
    docker: Reading,
    proc_root: str = "/proc",
    workers: int | None = None,
    settled: Collection[str] = (),
    on_cards: Callable[[tuple[NodeHolder, ...]], None] | None = None,
) -> ShmView:
    """One full inspection: the dir's entries, every process's mappings and descriptors, the verdict per file.

    ``settled``: the ids of containers this install recorded healthy (``build_view``, safety rule 2). ``on_cards``
    is handed the processes that hold a card's node open (``card_nodes.card_holders``), read by the same scan; it
    is not called when the scan could not be made whole."""
    try:
        listing = list_dir(cfg)
    except OSError as exc:
        empty = DirListing(0, (), Tmpfs(0, 0, 0))
        why = f"shm.dir {cfg.dir}: {exc.strerror or exc} (set shm.dir in {HOST_FILE} to the tmpfs the containers use)"
        return unavailable_view(cfg, listing=empty, containers=containers, docker=docker, proc_error=why)
    try:
        scan = scan_holders(listing.dir_dev, proc_root=proc_root, workers=workers)
    except OSError as exc:
        return unavailable_view(
            cfg, listing=listing, containers=containers, docker=docker, proc_error=f"{proc_root}: {exc.strerror or exc}"
        )
    if scan.unstable:
        return unavailable_view(
            cfg, listing=listing, containers=containers, docker=docker, proc_error=f"{proc_root}: {scan.unstable}"
        )
    names = {c.id: c.name for c in containers}
    resolve = _Resolver(proc_root, names, engine_ok=docker.ok)
    if on_cards is not None:
        on_cards(
            card_holders(
                scan.cards, names, container_of=resolve.container, command_of=resolve.command, proc_root=proc_root
            )
        )
    holders = {ino: [resolve.owner(pid, via) for pid, via in pairs] for ino, pairs in scan.holders().items()}
    live = {e.inode for e in listing.entries}
    deleted = _deleted_files(scan, live, holders, proc_root)
    unreadable = {pid: (resolve.command(pid), why) for pid, why in scan.unreadable.items()}
    return build_view(
        cfg,
        listing=listing,
        holders=holders,
        deleted=deleted,
        unreadable=unreadable,
        containers=containers,
        docker=docker,
        settled=settled,
    )


class _Resolver:
    """pid -> container name and command, read once per pid per inspection (only for pids that hold a file)."""

    def __init__(self, proc_root: str, names: Mapping[str, str], *, engine_ok: bool):
        self.proc_root = proc_root
        self.names = names  # the engine's containers, id -> name: the only ids shown as containers
        self.engine_ok = engine_ok
        self._owners: dict[tuple[int, str], Owner] = {}
        self._containers: dict[int, str | None] = {}
        self._commands: dict[int, str] = {}
        self._by_cgroup: dict[bytes | None, str | None] = {}
        self._by_cmdline: dict[bytes, str] = {}

    def owner(self, pid: int, via: str) -> Owner:
        key = (pid, via)
        o = self._owners.get(key)
        if o is None:
            o = self._owners[key] = Owner(pid=pid, via=via, container=self.container(pid), command=self.command(pid))
        return o

    def container(self, pid: int) -> str | None:
        if pid not in self._containers:
            text = _read_small(f"{self.proc_root}/{pid}/cgroup")
            if text not in self._by_cgroup:  # the processes of one container share their cgroup text
                candidates = parse_cgroup_container_ids(text.decode("utf-8", "replace")) if text else ()
                self._by_cgroup[text] = owner_container(candidates, self.names, engine_ok=self.engine_ok)
            self._containers[pid] = self._by_cgroup[text]
        return self._containers[pid]

    def command(self, pid: int) -> str:
        if pid not in self._commands:
            raw = _read_small(f"{self.proc_root}/{pid}/cmdline")
            if raw:
                # Masked before it is cut, like read_comm: a command line carries API keys (`--api-key ...`).
                # Redacted as a list, then joined: joined first, "--api-key 'sk two'" lost only its first word.
                # Once per distinct command line: the workers of one server share theirs (2,000 holders with one
                # command line took 0.4 s of redaction, one redaction each).
                shown = self._by_cmdline.get(raw)
                if shown is None:
                    argv = raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")
                    shown = self._by_cmdline[raw] = " ".join(redact_argv(argv))[:200]
                self._commands[pid] = shown
            else:
                self._commands[pid] = read_comm(pid, self.proc_root)  # a kernel thread or a zombie: [comm]
        return self._commands[pid]


def _read_small(path: str) -> bytes | None:
    # os-level calls: this runs once per holding pid, thousands of times on a busy host.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)


def _deleted_files(
    scan: HolderScan, live: set[int], holders: Mapping[int, Sequence[Owner]], proc_root: str
) -> list[ShmFile]:
    """Files on the tmpfs that are unlinked but still mapped or open: owned bytes with no path.

    Their size comes from the open descriptor when there is one, else from /proc/PID/map_files (root only),
    else from the mapping's extent (allocation then unknown, counted as 0).
    """
    found: dict[int, dict[str, object]] = {}
    for pid, recs in scan.unlinked_maps.items():
        for r in recs:
            if r.inode not in live and r.inode not in found:
                found[r.inode] = {"path": r.path + " (deleted)", "size": r.offset + r.length, "alloc": None}
                try:
                    s = os.stat(f"{proc_root}/{pid}/map_files/{r.start:x}-{r.end:x}")
                    found[r.inode].update(size=s.st_size, alloc=s.st_blocks * 512)
                except OSError:
                    pass
    for pid, fds in scan.fds.items():
        for f in fds:
            if f.nlink == 0 and f.inode not in live:
                entry = found.setdefault(f.inode, {"path": "", "size": f.size, "alloc": None})
                entry.update(size=f.size, alloc=f.allocated)
                if not entry["path"]:
                    try:
                        entry["path"] = os.readlink(f"{proc_root}/{pid}/fd/{f.fd}")
                    except OSError:
                        entry["path"] = "(deleted)"
    out = []
    for ino, e in sorted(found.items()):
        owners = tuple(holders.get(ino, ()))
        alloc = e["alloc"]
        out.append(
            ShmFile(
                path=str(e["path"]),
                dev=scan.dev,
                inode=ino,
                size_bytes=int(e["size"]),  # type: ignore[call-overload]
                allocated_bytes=int(alloc) if alloc is not None else 0,  # type: ignore[call-overload]
                owners=owners,
                state="owned",
                reason="unlinked but still "
                + describe_owners(owners)
                + ": its bytes return when the last holder exits",
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reconciler.observe.shm --dir D``: one inspection without a host file, as JSON.

    For benchmarks and debugging on a host without configs: Docker is consulted only with ``--docker-url``
    (otherwise its source reads "not consulted" and unowned files are ``blocked``). Exit 0 when both sources
    answered, else 1, like ``reconciler shm status``.
    """
    import argparse
    import json

    # start-up: the observer's own command line; importing this module for inspect_shm loads neither
    from reconciler.observe.containers import EngineObserver

    ap = argparse.ArgumentParser(prog="python -m reconciler.observe.shm", description=main.__doc__)
    ap.add_argument("--dir", required=True, help="the shm dir to inspect")
    ap.add_argument("--pattern", default="vllm_offload_*.mmap")
    ap.add_argument("--ignore-pid", type=int, action="append", default=[], help="excuse an uninspectable pid")
    ap.add_argument("--docker-url", default=None)
    ap.add_argument("--workers", type=int, default=None, help="processes sharing the /proc scan (default: by CPUs)")
    args = ap.parse_args(argv)

    @dataclass
    class _Cfg:
        dir: str
        pattern: str
        ignore_uninspectable_pids: list[int]

    cfg = _Cfg(args.dir.rstrip("/") or "/", args.pattern, list(args.ignore_pid))
    if args.docker_url:
        containers, docker = EngineObserver(args.docker_url).observe()
    else:
        containers, docker = (), Reading("docker", False, "not consulted (no --docker-url)")
    view = inspect_shm(cfg, containers=containers, docker=docker, workers=args.workers)
    # json.dumps without indent runs the C encoder in one go; json.dump would write piece by piece.
    sys.stdout.write(json.dumps(status_json(view)) + "\n")
    return 0 if view.readings_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
