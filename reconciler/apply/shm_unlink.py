"""The guarded reclaim's last gate (safety rule 4 of docs/design.md): the unlink of each file both inspections
agreed on, under the kernel's write lease, and the check that every removed name is gone.

Each removal opens ``shm.dir`` once (checked to be the directory the reclaim started from), opens the name
relative to it and takes the write lease (``take_lease``): granted only while no other open file description of
the file exists, so a holder every inspection missed still stops the unlink. Under the lease the name is checked
to be the inspected file, then unlinked. Called by ``reconciler.apply.shm_guard.reclaim`` only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import os
import signal
import stat as st_mode
from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.apply.shm_results import KeptFile, RefusalCode, RemovedFile
from reconciler.plan.observed import ShmFile

# fcntl(2): F_SETLEASE with F_WRLCK is granted only when no other open file description of the file exists (a
# mapping keeps its own, so a process that mapped the file and closed every descriptor still counts); checked on
# tmpfs by tests/real/test_shm_handoff.py. Leases need the file's owner or CAP_LEASE (a lane of another user
# makes its file: root without CAP_LEASE, as under a unit that bounds it away, is refused with EACCES), and
# /proc/sys/fs/leases-enable set. An opener while the lease is held waits for its release (at most
# /proc/sys/fs/lease-break-time) and the owner gets a signal: SIGIO unless F_SETSIG names another, and SIGIO's
# default action ends the process, so the gate names SIGURG, whose default is to ignore it.
F_SETLEASE = 1024
F_GETLEASE = 1025
F_SETSIG = 10
LEASE_SIGNAL = signal.SIGURG
LEASES_ENABLE = "/proc/sys/fs/leases-enable"
LEASE_REFUSED: RefusalCode = "lease_refused"
# capability(7): the lease on a file of another uid needs CAP_LEASE, bit 28 of the capability sets.
CAP_LEASE = 28
PROC_SELF_STATUS = "/proc/self/status"


class LeaseRefused(Exception):
    """The kernel did not grant the write lease: the file is kept. ``code`` is the refusal's reason key;
    ``no_right``: refused for what this process may do (EACCES, EPERM), not for what holds the file, so the reclaim
    fails with the fix in its errors rather than keeping the file as in use."""

    def __init__(self, message: str, code: RefusalCode = LEASE_REFUSED, *, no_right: bool = False):
        super().__init__(message)
        self.code: RefusalCode = code
        self.no_right = no_right


@dataclass
class Lease:
    """A granted write lease on one open file (``take_lease``); ``release`` ends it and closes the descriptor."""

    fd: int
    stat: os.stat_result

    def intact(self) -> bool:
        """Still the write lease: no opener has started to break it."""
        try:
            return fcntl.fcntl(self.fd, F_GETLEASE) == fcntl.F_WRLCK
        except OSError:
            return False

    def release(self) -> None:
        with contextlib.suppress(OSError):  # closing the descriptor ends the lease all the same
            fcntl.fcntl(self.fd, F_SETLEASE, fcntl.F_UNLCK)
        os.close(self.fd)


def has_cap_lease(status: str = PROC_SELF_STATUS) -> bool | None:
    """Whether CAP_LEASE is in this process's effective set (``CapEff`` of /proc/self/status), or None where it
    cannot be read."""
    try:
        with open(status, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_LEASE & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _no_lease_right(path: str, st: os.stat_result | None, exc: OSError) -> str:
    """Why the kernel said EACCES or EPERM to the lease, in words with the fix: the lease needs the file's owner
    (the process's file-system uid) or CAP_LEASE, and a lane of another user made this file."""
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    if st is not None and st.st_uid != os.geteuid() and has_cap_lease() is not True:
        return (
            f"cannot take the write lease on {path}: it belongs to uid {st.st_uid} and this process lacks CAP_LEASE "
            f"(the kernel answered {code}); the unit that `reconciler systemd-unit` prints grants it "
            "(CapabilityBoundingSet= names CAP_LEASE): run the reclaim there, or as root with CAP_LEASE"
        )
    return f"cannot take the write lease on {path}: the kernel answered {code} ({exc.strerror or exc})"


def _leases_off() -> bool:
    try:
        with open(LEASES_ENABLE, encoding="ascii") as fh:
            return fh.read().strip() == "0"
    except OSError:
        return False


def take_lease(dfd: int, name: str, *, path: str | None = None) -> Lease:
    """A write lease on the file ``name`` of the opened directory ``dfd``, or LeaseRefused saying why.

    Opened ``O_RDONLY`` (a descriptor open for writing would itself count against a write lease),
    ``O_NOFOLLOW`` (never a symlink's target) and ``O_NONBLOCK`` (a lease someone else holds refuses at once,
    rather than waiting out its break time). FileNotFoundError passes through: the name is gone. ``path`` names
    the file in a refusal's words (``name`` when not given).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise LeaseRefused("another process holds a lease on it: it is in use") from None
        raise LeaseRefused(f"cannot open it for the write lease: {exc.strerror or exc}") from None
    st: os.stat_result | None = None
    try:
        st = os.fstat(fd)
        if not st_mode.S_ISREG(st.st_mode):
            raise LeaseRefused("not a regular file when opened for the write lease")
        fcntl.fcntl(fd, F_SETSIG, LEASE_SIGNAL)
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK)
        return Lease(fd, st)
    except LeaseRefused:
        os.close(fd)
        raise
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise LeaseRefused(_no_lease_right(path or name, st, exc), no_right=True) from None
        if exc.errno in (errno.EAGAIN, errno.EBUSY):
            why = "the kernel refused the write lease: another open file description of it exists (a process maps it or holds it open)"
        elif exc.errno == errno.EINVAL and _leases_off():
            why = f"the kernel refused the write lease: leases are off ({LEASES_ENABLE} is 0; set it to 1)"
        else:
            why = f"the kernel refused the write lease: {exc.strerror or exc}"
        raise LeaseRefused(why) from None


def lease_kept(f: ShmFile, exc: LeaseRefused) -> KeptFile:
    """The kept entry for a file whose lease was refused (the simulation's unlink builds it here too)."""
    return KeptFile(f.path, f"{exc}; not removed", f.state, code=exc.code)


def _unlink_agreed(
    directory: str, dir_id: tuple[int, int], agreed: Sequence[ShmFile], *, pattern: str | None = None
) -> tuple[list[RemovedFile], list[KeptFile], list[str]]:
    """Unlink each agreed file by name inside the opened dir, re-checking it is still that file first (and, with
    ``pattern``, that it is a name of the dir matching it exactly)."""
    removed: list[RemovedFile] = []
    kept: list[KeptFile] = []
    errors: list[str] = []
    if not agreed:
        return removed, kept, errors
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        msg = f"{directory}: cannot open: {exc.strerror or exc}"
        return removed, [KeptFile(f.path, msg, f.state, code="inspections_disagree") for f in agreed], [msg]
    try:
        d = os.fstat(dfd)
        if (d.st_dev, d.st_ino) != dir_id:
            msg = f"{directory} was replaced during the reclaim (device/inode changed); nothing removed"
            return removed, [KeptFile(f.path, msg, f.state, code="inspections_disagree") for f in agreed], [msg]
        for f in agreed:
            parent, name = os.path.split(f.path)
            if parent != directory or not name or (pattern is not None and not fnmatch.fnmatchcase(name, pattern)):
                kept.append(
                    KeptFile(
                        f.path,
                        "not a name of shm.dir matching shm.pattern: never removed",
                        "skipped",
                        code="invalid_entry",
                    )
                )
                continue
            try:
                lease = take_lease(dfd, name, path=f.path)
            except FileNotFoundError:
                kept.append(KeptFile(f.path, "gone before removal (removed by someone else)", "gone"))
                continue
            except LeaseRefused as exc:
                kept.append(lease_kept(f, exc))
                if exc.no_right:
                    errors.append(str(exc))
                continue
            try:
                s = lease.stat
                try:
                    named = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    kept.append(KeptFile(f.path, "gone before removal (removed by someone else)", "gone"))
                    continue
                if (
                    not st_mode.S_ISREG(s.st_mode)
                    or s.st_nlink != 1
                    or (named.st_dev, named.st_ino) != (s.st_dev, s.st_ino)
                    or (s.st_dev, s.st_ino, s.st_size) != (f.dev, f.inode, f.size_bytes)
                ):
                    kept.append(
                        KeptFile(
                            f.path,
                            "changed just before removal (not the inspected file any more)",
                            f.state,
                            code="file_owned",
                        )
                    )
                    continue
                if not lease.intact():
                    kept.append(
                        lease_kept(f, LeaseRefused("a process opened it while the write lease was held: in use"))
                    )
                    continue
                try:
                    os.unlink(name, dir_fd=dfd)
                except FileNotFoundError:
                    kept.append(KeptFile(f.path, "gone before removal (removed by someone else)", "gone"))
                    continue
                except OSError as exc:
                    kept.append(
                        KeptFile(f.path, f"unlink failed: {exc.strerror}", f.state, code="inspections_disagree")
                    )
                    errors.append(f"{f.path}: unlink failed: {exc.strerror}")
                    continue
            finally:
                lease.release()
            removed.append(RemovedFile(f.path, s.st_size, s.st_blocks * 512, s.st_dev, s.st_ino))
    finally:
        os.close(dfd)
    return removed, kept, errors


def _verify_absent(directory: str, removed: Sequence[RemovedFile]) -> tuple[bool, list[str]]:
    """Every removed name must be absent now; a name present again (re-created meanwhile) is reported."""
    errors = []
    for f in removed:
        try:
            s = os.stat(f.path, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{f.path}: cannot verify removal: {exc.strerror}")
            continue
        if (s.st_dev, s.st_ino) == (f.dev, f.inode):
            errors.append(f"{f.path}: still present after unlink")
        else:
            errors.append(f"{f.path}: removed, but a new file of that name appeared right after (inode {s.st_ino})")
    return not errors, errors
