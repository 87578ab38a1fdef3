"""The one guarded removal of orphan offload files: ``reclaim(cfg, observe_docker=..., confirm=...)``.

Every deletion of an offload file goes through here: ``reconciler shm reclaim``, and the apply layer's enter
(room for the recipe's offload capacity) and leave (the recipe's files after its container stopped).
The safety rules 4 and 5 of docs/design.md, on top of the inspection's rules 1-3 (``reconciler.observe.shm``):

- Without ``confirm``: one inspection, nothing removed; the result names what would go and what stays.
- With ``confirm``: two full inspections ``confirm_interval_s`` apart, Docker observed afresh for each. A file
  is removed only when both call it ``orphan`` with the same path, device, inode, size and allocation. Any
  unavailable source, or a running native-offload container that could own an unowned file (one not settled
  and seen holding its own: ``observe.shm.offload_blockers``), refuses the whole reclaim.
- Each removal opens ``shm.dir`` once (checked to be the directory inspected), opens the name relative to it
  (``O_RDONLY|O_NOFOLLOW``) and takes the kernel's write lease on it (``reconciler.apply.shm_unlink``): the kernel grants one only
  while no other open file description of the file exists, one that a mapping alone keeps included, so a holder
  that every inspection missed still stops the unlink. Under the granted lease the name is checked to be that
  same file, unlinked relative to the directory, and the lease released. A refused lease keeps the file with the
  reason code ``lease_refused``.
- Afterwards every removed name is checked to be absent, and the bytes freed are reported.

What the guard reads of the host and its one write go through a ``ShmIO`` (``REAL_SHM``: this module's reads and
``reconciler.apply.shm_unlink``'s unlink), its waits through a ``Clock``: the host's I/O seams
(``reconciler.apply.host_io``), which the simulation hands in whole.

Scope (docs/design.md, safety rule 1, enforced here again whatever the loader let through): the whole reclaim is
refused, with the reason, when ``shm.pattern`` is not a literal prefix and suffix around one ``*``, when
``shm.dir`` is not an absolute, normalised path other than ``/``, or when at reclaim time it is not a tmpfs
(statfs f_type ``TMPFS_MAGIC``) mounted right there (a mount point of type tmpfs in /proc/self/mountinfo).
Every path an inspection returns is checked again before it can become a candidate: directly inside
``shm.dir`` by its real path, an exact ``fnmatch`` of the pattern on its name, a regular file and not a symlink.
With ``only_paths`` (the reclaim action's ``paths``, or the paths of the dry run the operator saw) nothing
outside that exact set is ever unlinked, even a matching unowned file that appeared since.
"""

from __future__ import annotations

import fnmatch
import os
import stat as st_mode
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from reconciler.apply.shm_results import KeptFile, ReclaimResult, RefusalCode, RemovedFile
from reconciler.apply.shm_unlink import _unlink_agreed, _verify_absent
from reconciler.base import mounts
from reconciler.base.clock import REAL_CLOCK, Clock
from reconciler.model import ShmConfig, check_shm_dir, check_shm_pattern
from reconciler.observe.shm import inspect_shm
from reconciler.plan.observed import ContainerView, Reading, ShmFile, ShmView, Tmpfs

DockerObservation = Callable[[], tuple[tuple[ContainerView, ...], Reading]]


def _removable(f: ShmFile) -> RemovedFile:
    return RemovedFile(f.path, f.size_bytes, f.allocated_bytes, f.dev, f.inode)


class Refusal(NamedTuple):
    """Why a view forbids every removal: its code and its words."""

    code: RefusalCode
    text: str


def refusal_of(view: ShmView) -> Refusal | None:
    """Why a view forbids every removal, or None. Names the source or the containers."""
    if not view.docker.ok:
        return Refusal("source_unavailable", f"docker {view.docker.render()}")
    if not view.proc.ok:
        code: RefusalCode = "uninspectable_process" if view.proc.cause == "uninspectable" else "source_unavailable"
        return Refusal(code, f"proc {view.proc.render()}")
    if view.blocking_containers:
        return Refusal(
            "offload_container_running",
            "running container(s) with native offload configured: "
            + ", ".join(view.blocking_containers)
            + "; stop them (or let leave do it) before reclaiming",
        )
    return None


def _with_claims(view: ShmView, claimed: Collection[str]) -> ShmView:
    """The view with each claimed file that only a running offload container kept ``blocked`` made an orphan (both
    sources answered; a file with a holder stays owned)."""
    if not claimed or not view.readings_ok or not view.blocking_containers:
        return view
    files = tuple(
        replace(
            f,
            state="orphan",
            reason="no live process holds it; a stopped container of this install was the only one seen holding it",
        )
        if f.state == "blocked" and f.path in claimed
        else f
        for f in view.files
    )
    return replace(view, files=files)


def _refusal(view: ShmView, selected: Callable[[ShmFile], bool]) -> Refusal | None:
    """``refusal_of``, except that running offload containers refuse nothing when no file asked for is one they
    keep (every such file claimed: ``_with_claims``)."""
    refused = refusal_of(view)
    if refused is None or not view.readings_ok:
        return refused
    asked = [f for f in view.files if selected(f)]
    if not any(f.state == "blocked" for f in asked) and any(f.state == "orphan" for f in asked):
        return None
    return refused


def _kept_from(
    view: ShmView, skip: Collection[str] = (), selected: Callable[[ShmFile], bool] = lambda f: True
) -> list[KeptFile]:
    kept = []
    for f in view.files:
        if f.path in skip:
            continue
        if f.state == "orphan" and not selected(f):
            kept.append(KeptFile(f.path, "orphan, but not among the paths this reclaim was asked for", f.state))
        else:
            kept.append(KeptFile(f.path, f.reason, f.state))
    kept += [KeptFile(path, why, "skipped", code="invalid_entry") for path, why in view.skipped if path not in skip]
    return kept


def _sources(view: ShmView) -> dict[str, str]:
    return {"proc": view.proc.render(), "docker": view.docker.render()}


def _inspect(
    cfg: ShmConfig, observe_docker: DockerObservation, proc_root: str, *, settled: Collection[str] = ()
) -> ShmView:
    containers, docker = observe_docker()
    return inspect_shm(cfg, containers=containers, docker=docker, proc_root=proc_root, settled=settled)


@dataclass(frozen=True)
class ShmIO:
    """What the guard reads of the host, and its one write: one inspection of shm.dir and every process, shm.dir's
    identity (device, inode), why it is not a tmpfs mounted right there, why a path may never be a candidate, the
    unlink of the files both inspections agreed on (under the kernel's write lease), the check that they are gone,
    and the tmpfs's figures afterwards."""

    inspect: Callable[..., ShmView]
    dir_identity: Callable[[str], tuple[int, int]]
    mount_refusal: Callable[[str], str | None]
    path_refusal: Callable[[str, str, str], str | None]
    unlink_agreed: Callable[..., tuple[list[RemovedFile], list[KeptFile], list[str]]]
    verify_absent: Callable[[str, Sequence[RemovedFile]], tuple[bool, list[str]]]
    tmpfs_of: Callable[[str], Tmpfs]


def reclaim(
    cfg: ShmConfig,
    *,
    observe_docker: DockerObservation,
    confirm: bool,
    only_paths: Collection[str] | None = None,
    sleep: Callable[[float], None] | None = None,
    proc_root: str = "/proc",
    settled: Callable[[], Collection[str]] | None = None,
    claimed: Collection[str] = (),
    io: ShmIO | None = None,
    clock: Clock = REAL_CLOCK,
) -> ReclaimResult:
    """Remove the orphan offload files (all, or those in ``only_paths``), guarded as the module says.

    Never raises for a source that fails: the result is ``refused`` with the source named. ``sleep`` is the
    wait between the inspections (tests inject one that changes files meanwhile). ``settled`` reads, for each
    inspection afresh, the ids of the containers this install recorded healthy (``Ownership.healthy``): a running
    offload container among them that is seen holding its file does not keep the unowned ones (safety rule 2).
    ``claimed``: paths of files a stopped container of this install was the only one seen holding (a failed
    enter's, a leave's own); no running offload container can be making such a file, so none keeps it blocked
    (it must still be unowned, unchanged, in both inspections, and its lease granted).
    ``io`` and ``clock``: the host's reads and write and its clocks (``REAL_SHM``, ``REAL_CLOCK``; the simulation's).
    """
    io = io or REAL_SHM
    t0 = clock.monotonic()
    wanted = None if only_paths is None else set(only_paths)

    def selected(f: ShmFile) -> bool:
        return wanted is None or f.path in wanted

    base: dict[str, Any] = {"dir": cfg.dir, "pattern": cfg.pattern, "confirmed": confirm}
    refused_scope = scope_refusal(cfg.dir, cfg.pattern)
    if refused_scope is not None:
        return ReclaimResult(
            **base, refused=refused_scope, refused_code="source_unavailable", elapsed_s=clock.monotonic() - t0
        )
    try:
        dir_id = io.dir_identity(cfg.dir)
    except OSError as exc:
        return ReclaimResult(
            **base,
            refused=f"shm.dir {cfg.dir}: {exc.strerror or exc}",
            refused_code="source_unavailable",
            elapsed_s=clock.monotonic() - t0,
        )
    refused_mount = io.mount_refusal(cfg.dir)
    if refused_mount is not None:
        return ReclaimResult(
            **base, refused=refused_mount, refused_code="source_unavailable", elapsed_s=clock.monotonic() - t0
        )

    def inspect() -> ShmView:
        view = _in_scope(cfg, io.inspect(cfg, observe_docker, proc_root, settled=settled() if settled else ()), io)
        return _with_claims(view, claimed)

    first = inspect()
    common: dict[str, Any] = dict(base, tmpfs_before=first.tmpfs, blocking_containers=first.blocking_containers)
    candidates = [f for f in first.files if f.state == "orphan" and selected(f)]
    refused = _refusal(first, selected)
    if refused is not None:
        # Refused only matters when something could have gone: with no unowned file there is nothing to do.
        unowned = [f for f in first.files if f.state != "owned" and selected(f)]
        matters = bool(unowned) or not first.readings_ok
        return ReclaimResult(
            **common,
            kept=tuple(_kept_from(first)),
            refused=refused.text if matters else None,
            refused_code=refused.code if matters else None,
            verified=confirm and not unowned and first.readings_ok,
            sources=_sources(first),
            inspections=1,
            elapsed_s=clock.monotonic() - t0,
        )
    if not confirm or not candidates:
        candidate_paths = {f.path for f in candidates}
        return ReclaimResult(
            **common,
            candidates=tuple(_removable(f) for f in candidates),
            kept=tuple(_kept_from(first, skip=candidate_paths, selected=selected)),
            verified=confirm,  # nothing to remove: trivially verified when confirmed
            sources=_sources(first),
            tmpfs_after=first.tmpfs if confirm else None,
            inspections=1,
            elapsed_s=clock.monotonic() - t0,
        )

    (sleep or clock.sleep)(cfg.confirm_interval_s)
    second = inspect()
    common["blocking_containers"] = tuple(sorted(set(first.blocking_containers) | set(second.blocking_containers)))
    refused = _refusal(second, selected)
    if refused is not None:
        return ReclaimResult(
            **common,
            candidates=tuple(_removable(f) for f in candidates),
            kept=tuple(_kept_from(second)),
            refused=refused.text,
            refused_code=refused.code,
            sources=_sources(second),
            inspections=2,
            elapsed_s=clock.monotonic() - t0,
        )

    agreed, kept = compare_inspections(candidates, second, selected=selected)
    # Never outside the exact set asked for, whatever the inspections said (the last gate before any unlink).
    agreed = [f for f in agreed if selected(f)]
    removed, more_kept, errors = io.unlink_agreed(cfg.dir, dir_id, agreed, pattern=cfg.pattern)
    kept += more_kept
    verified, verify_errors = io.verify_absent(cfg.dir, removed)
    errors += verify_errors
    handled = {f.path for f in removed} | {k.path for k in kept}
    kept += [k for k in _kept_from(second, selected=selected) if k.path not in handled]
    try:
        after = io.tmpfs_of(cfg.dir)
    except OSError:
        after = None
    return ReclaimResult(
        **common,
        reclaimed=tuple(removed),
        candidates=tuple(_removable(f) for f in candidates),
        kept=tuple(kept),
        verified=verified and not errors,
        sources=_sources(second),
        errors=tuple(errors),
        tmpfs_after=after,
        inspections=2,
        elapsed_s=clock.monotonic() - t0,
    )


def compare_inspections(
    candidates: Sequence[ShmFile], second: ShmView, *, selected: Callable[[ShmFile], bool] = lambda f: True
) -> tuple[list[ShmFile], list[KeptFile]]:
    """Pure: the first inspection's orphans that the second sees as the very same unowned file, and the rest."""
    now = {f.path: f for f in second.files}
    agreed: list[ShmFile] = []
    kept: list[KeptFile] = []
    for f in candidates:
        g = now.get(f.path)
        if g is None:
            skipped = dict(second.skipped).get(f.path)
            why = f"no longer a candidate: {skipped}" if skipped else "gone before the second inspection"
            kept.append(
                KeptFile(f.path, why, "skipped", code="invalid_entry") if skipped else KeptFile(f.path, why, "gone")
            )
            continue
        # A candidate the second inspection does not agree on: owned now, or not the same file any more.
        code: RefusalCode = "file_owned" if g.state in ("owned", "blocked") else "inspections_disagree"
        if (g.dev, g.inode) != (f.dev, f.inode):
            why = f"replaced between the inspections (inode {f.inode} -> {g.inode})"
        elif g.size_bytes != f.size_bytes:
            why = f"size changed between the inspections ({f.size_bytes} -> {g.size_bytes} bytes)"
        elif g.allocated_bytes != f.allocated_bytes:
            why = f"allocation changed between the inspections ({f.allocated_bytes} -> {g.allocated_bytes} bytes)"
        elif g.state != "orphan":
            why = f"{g.state} at the second inspection: {g.reason}"
        else:
            agreed.append(g)
            continue
        kept.append(KeptFile(f.path, why, g.state, code=code))
    first_paths = {f.path for f in candidates}
    for g in second.files:
        if g.state == "orphan" and g.path not in first_paths and selected(g):
            kept.append(
                KeptFile(
                    g.path,
                    "appeared or became unowned after the first inspection",
                    g.state,
                    code="inspections_disagree",
                )
            )
    return agreed, kept


# ---------------------------------------------------------------- scope: which dir, which names, which paths


def scope_refusal(directory: str, pattern: str) -> str | None:
    """Pure: why ``shm.dir``/``shm.pattern`` may not be reclaimed from at all (the model's rules, checked again:
    a config built around the loader, or a later edit of the rules there, must not widen what is deleted)."""
    problem = check_shm_pattern(pattern) or check_shm_dir(directory)
    return None if problem is None else f"refusing to reclaim: {problem}"


def tmpfs_mount_refusal(directory: str, *, mountinfo_path: str | None = None) -> str | None:
    """Why ``directory`` is not, right now, a tmpfs mounted exactly there; None when it is.

    Both must agree: statfs(2) on the directory gives TMPFS_MAGIC, and /proc/self/mountinfo has a tmpfs mounted on
    its real path (which must be the path itself: no symlink on the way). What cannot be read refuses.
    """
    fix = "shm.dir must be the mount point of a tmpfs (like /dev/shm); nothing was removed"
    real = os.path.realpath(directory)
    if real != directory:
        return f"refusing to reclaim: shm.dir {directory} is reached through a symlink (real path {real}); {fix}"
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"refusing to reclaim: shm.dir {directory}: {exc.strerror or exc}; {fix}"
    try:
        ftype = mounts.fs_magic(dfd)
    finally:
        os.close(dfd)
    if ftype is None:
        return f"refusing to reclaim: statfs of shm.dir {directory} failed, cannot tell whether it is a tmpfs; {fix}"
    if ftype != mounts.TMPFS_MAGIC:
        return (
            f"refusing to reclaim: shm.dir {directory} is not a tmpfs (statfs f_type 0x{ftype:08x}, not "
            f"0x{mounts.TMPFS_MAGIC:08x}); {fix}"
        )
    mountinfo_path = mountinfo_path or mounts.MOUNTINFO
    try:
        mountinfo = mounts.read_mountinfo(mountinfo_path)
    except OSError as exc:
        return f"refusing to reclaim: {mountinfo_path} cannot be read ({exc.strerror or exc}); {fix}"
    at = mounts.mount_at(real, mounts.parse_mountinfo(mountinfo))
    fstype = at.fstype if at is not None else None
    if fstype is None:
        return f"refusing to reclaim: shm.dir {directory} is inside a tmpfs but not its mount point ({mountinfo_path}); {fix}"
    if fstype != "tmpfs":
        return f"refusing to reclaim: shm.dir {directory} is mounted as {fstype}, not tmpfs ({mountinfo_path}); {fix}"
    return None


def path_refusal(directory: str, pattern: str, path: str) -> str | None:
    """Why a path an inspection returned may never be a candidate; None when it is a plain file of the dir whose
    name matches the pattern exactly. Reads the file's lstat and real path (never follows a symlink for a verdict)."""
    parent, name = os.path.split(path)
    if parent != directory or not name or name in (".", ".."):
        return f"not directly inside shm.dir {directory}"
    if not fnmatch.fnmatchcase(name, pattern):
        return f"name does not match shm.pattern {pattern!r}"
    try:
        s = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if st_mode.S_ISLNK(s.st_mode):
        return "a symlink: never followed, never removed"
    if not st_mode.S_ISREG(s.st_mode):
        return "not a regular file"
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        return f"its real path lies outside shm.dir {directory}"
    return None


def _in_scope(cfg: ShmConfig, view: ShmView, io: ShmIO) -> ShmView:
    """The view with every file that fails ``path_refusal`` moved to ``skipped``: never a candidate."""
    keep: list[ShmFile] = []
    skipped = list(view.skipped)
    for f in view.files:
        why = io.path_refusal(cfg.dir, cfg.pattern, f.path)
        if why is None:
            keep.append(f)
        else:
            skipped.append((f.path, why))
    if len(keep) == len(view.files):
        return view
    return replace(view, files=tuple(keep), skipped=tuple(skipped))


def _dir_identity(path: str) -> tuple[int, int]:
    s = os.stat(path)
    if not st_mode.S_ISDIR(s.st_mode):
        raise NotADirectoryError(20, "not a directory", path)
    return s.st_dev, s.st_ino


def _tmpfs_of(path: str) -> Tmpfs:
    v = os.statvfs(path)
    return Tmpfs(v.f_blocks * v.f_frsize, (v.f_blocks - v.f_bfree) * v.f_frsize, v.f_bavail * v.f_frsize)


REAL_SHM = ShmIO(
    inspect=_inspect,
    dir_identity=_dir_identity,
    mount_refusal=tmpfs_mount_refusal,
    path_refusal=path_refusal,
    unlink_agreed=_unlink_agreed,
    verify_absent=_verify_absent,
    tmpfs_of=_tmpfs_of,
)
