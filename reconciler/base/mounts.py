"""Which filesystem a directory is on: ``/proc/self/mountinfo`` parsed (pure) and statfs(2)'s ``f_type``.

The one helper behind both places that ask whether ``shm.dir`` is a tmpfs mount point: the loader, when it reads
configs/host.yaml (``reconciler.load.tmpfs.shm_dir_mount_problem``), and the shm guard, again right before it deletes
(``reconciler.apply.shm_guard.tmpfs_mount_refusal``): a mount can come or go between the two (docs/design.md, safety
rule 1). Each caller words its own verdict; this module only reads and parses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

TMPFS_MAGIC = 0x01021994  # linux/magic.h
MOUNTINFO = "/proc/self/mountinfo"

_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as a 3-digit octal escape (``\\040``)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Pure: each line's mount point and filesystem type, in the file's order (a later mount on the same point
    shadows an earlier one). Lines that do not parse are left out."""
    out: list[Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            # Six fixed fields, then optional ones, then "-" and the filesystem type (proc(5)).
            sep = fields.index("-", 6)
            out.append(Mount(_unescape(fields[4]), fields[sep + 1]))
        except (ValueError, IndexError):
            continue
    return out


def mount_holding(path: str, mounts: Iterable[Mount]) -> Mount:
    """Pure: the mount that holds ``path`` (a real path): the deepest mount point on its way, the last one given
    where several share it. ``Mount("/", "?")`` when none is listed."""
    best = Mount("/", "?")
    for m in mounts:
        inside = path == m.point or path.startswith(m.point.rstrip("/") + "/")
        if inside and len(m.point) >= len(best.point):
            best = m
    return best


def mount_at(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """Pure: the mount whose mount point is exactly ``path`` (the last one: it shadows the others), else None."""
    found = None
    for m in mounts:
        if m.point == path:
            found = m
    return found


def read_mountinfo(path: str | None = None) -> str:
    """The text of ``path`` (default: this process's mountinfo). Raises OSError when it cannot be read."""
    with open(path or MOUNTINFO, encoding="utf-8", errors="replace") as fh:
        return fh.read()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def fs_magic(target: str | int) -> int | None:
    """statfs(2)'s ``f_type`` (the first field of struct statfs on Linux) of a path, or fstatfs(2)'s of an open
    descriptor; None when it cannot be had. The guard passes the descriptor it opened with O_NOFOLLOW, so the
    answer is about that very directory, not whatever a path names a moment later."""
    try:
        buf = ctypes.create_string_buffer(512)
        if isinstance(target, int):
            rc = _libc().fstatfs(target, buf)
        else:
            rc = _libc().statfs(os.fsencode(target), buf)
        if rc != 0:
            return None
        return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    except (OSError, AttributeError, TypeError):
        return None
