"""shm.dir's tmpfs, as the host shows it: whether shm.dir is an existing tmpfs mount point, its size and its free
room.

Read through a ``TmpfsReads`` (``REAL_TMPFS``: these functions) handed to the host file's reader
(``reconciler.load.host_file``) and the cross-checks (``reconciler.load.cross_checks``); it is the loader's part of the
host's I/O seams (``reconciler.apply.host_io.HostIO.tmpfs``), which the simulation replaces whole.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from reconciler.base import mounts
from reconciler.base.mounts import MOUNTINFO, TMPFS_MAGIC


def shm_dir_mount_problem(directory: str, *, mountinfo: str | None = None) -> str | None:
    """None when ``directory`` is an existing tmpfs mount point; else what is wrong, which source said so, and the fix.

    Reads /proc/self/mountinfo (or ``mountinfo``, for tests); where that cannot be read, statfs(2)'s f_type and
    os.path.ismount. The shm guard may call this again before it deletes anything."""
    fix = f"mount one there (mount -t tmpfs -o size=32g tmpfs {directory}) or point shm.dir at one, like /dev/shm"
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return f"shm.dir {directory} does not exist; {fix}"
    except OSError as exc:
        return f"shm.dir {directory} cannot be examined ({exc.strerror or exc}); {fix}"
    real = os.path.realpath(directory)
    if stat.S_ISLNK(st.st_mode) or real != directory:
        return (
            f"shm.dir {directory} is reached through a symlink (its real path is {real}); offload files are checked "
            f"to lie inside shm.dir by their real path, so write dir: {real}"
        )
    if not stat.S_ISDIR(st.st_mode):
        return f"shm.dir {directory} is not a directory; {fix}"
    if mountinfo is None:
        try:
            mountinfo = mounts.read_mountinfo()
        except OSError:
            mountinfo = None
    if mountinfo is not None:
        held = mounts.mount_holding(real, mounts.parse_mountinfo(mountinfo))
        mnt, fstype = held.point, held.fstype
        if fstype != "tmpfs":
            return f"shm.dir {directory} is not a tmpfs: {MOUNTINFO} shows it on {fstype} mounted at {mnt}; {fix}"
        if mnt != real:
            return (
                f"shm.dir {directory} is inside the tmpfs mounted at {mnt} ({MOUNTINFO}) but is not its mount point; "
                f"the tmpfs's size and free room are those of {mnt}: write dir: {mnt}, or {fix}"
            )
        return None
    ftype = mounts.fs_magic(real)
    if ftype is None:
        return f"shm.dir {directory}: cannot tell whether it is a tmpfs ({MOUNTINFO} and statfs both unavailable)"
    if ftype != TMPFS_MAGIC:
        return f"shm.dir {directory} is not a tmpfs: statfs gives f_type 0x{ftype:08x}, not TMPFS_MAGIC 0x{TMPFS_MAGIC:08x}; {fix}"
    if not os.path.ismount(real):
        return f"shm.dir {directory} is on a tmpfs (statfs) but is not its mount point; {fix}"
    return None


def tmpfs_size(directory: str) -> int | None:
    """Size in bytes of the filesystem holding ``directory``; None when it does not exist."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def tmpfs_free(directory: str) -> int | None:
    """Bytes free now on the filesystem holding ``directory``; None when it does not exist."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_frsize * st.f_bavail


@dataclass(frozen=True)
class TmpfsReads:
    """What the loader reads of shm.dir's tmpfs: whether it is a tmpfs mount point, its size, its free room."""

    mount_problem: Callable[[str], str | None] = shm_dir_mount_problem
    size: Callable[[str], int | None] = tmpfs_size
    free: Callable[[str], int | None] = tmpfs_free


REAL_TMPFS = TmpfsReads()
