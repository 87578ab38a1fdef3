"""reconciler.base.mounts: the one mountinfo parser and statfs check behind the loader and the shm guard.

The parse on captured text (pure), then the same functions on this machine's real mounts: a tmpfs mounted by
the test, the disk under the temporary directory, and both callers agreeing about them.
"""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.apply.shm_guard import tmpfs_mount_refusal
from reconciler.base import mounts
from reconciler.load.tmpfs import shm_dir_mount_problem

# Captured from a Debian container (trimmed); line 4 has a space in its mount point, line 5 optional fields.
CAPTURED = """\
520 470 0:50 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
521 520 0:53 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
525 520 0:58 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=65536k
530 520 0:61 / /srv/with\\040space rw,relatime - tmpfs tmpfs rw,size=1024k
531 520 254:1 /data /srv/data rw,relatime shared:7 master:3 - ext4 /dev/vda1 rw
532 531 0:62 / /srv/data rw,relatime - tmpfs tmpfs rw
not a mountinfo line
"""


def test_parse_reads_points_and_types_and_undoes_escapes() -> None:
    parsed = mounts.parse_mountinfo(CAPTURED)
    assert [(m.point, m.fstype) for m in parsed] == [
        ("/", "overlay"),
        ("/proc", "proc"),
        ("/dev/shm", "tmpfs"),
        ("/srv/with space", "tmpfs"),
        ("/srv/data", "ext4"),
        ("/srv/data", "tmpfs"),
    ]


def test_the_mount_holding_a_path_is_the_deepest_and_the_last_on_one_point() -> None:
    parsed = mounts.parse_mountinfo(CAPTURED)
    assert mounts.mount_holding("/dev/shm/vllm_offload_1.mmap", parsed) == mounts.Mount("/dev/shm", "tmpfs")
    assert mounts.mount_holding("/dev/shmx", parsed) == mounts.Mount("/", "overlay")  # a prefix is not a parent
    assert mounts.mount_holding("/srv/data/x", parsed) == mounts.Mount("/srv/data", "tmpfs")  # shadowed ext4
    assert mounts.mount_holding("/anything", []) == mounts.Mount("/", "?")


def test_the_mount_at_a_point_is_exact() -> None:
    parsed = mounts.parse_mountinfo(CAPTURED)
    assert mounts.mount_at("/srv/with space", parsed) == mounts.Mount("/srv/with space", "tmpfs")
    assert mounts.mount_at("/dev/shm/sub", parsed) is None
    assert mounts.mount_at("/srv/data", parsed) == mounts.Mount("/srv/data", "tmpfs")


def test_on_this_machine_a_tmpfs_is_told_from_a_disk(shared_tmpfs: Path, tmp_path: Path) -> None:
    real = mounts.parse_mountinfo(mounts.read_mountinfo())
    assert mounts.mount_at(str(shared_tmpfs), real) == mounts.Mount(str(shared_tmpfs), "tmpfs")
    assert mounts.fs_magic(str(shared_tmpfs)) == mounts.TMPFS_MAGIC
    fd = os.open(shared_tmpfs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert mounts.fs_magic(fd) == mounts.TMPFS_MAGIC
    finally:
        os.close(fd)
    held = mounts.mount_holding(str(tmp_path), real)
    assert mounts.fs_magic(str(tmp_path)) != mounts.TMPFS_MAGIC or held.fstype == "tmpfs"
    assert mounts.fs_magic(str(tmp_path / "missing")) is None


def test_the_loader_and_the_guard_agree(shared_tmpfs: Path, tmp_path: Path) -> None:
    """Both call sites stand on this module: a tmpfs mount point passes both; a subdirectory of it fails both."""
    assert shm_dir_mount_problem(str(shared_tmpfs)) is None
    assert tmpfs_mount_refusal(str(shared_tmpfs)) is None
    sub = shared_tmpfs / "reconciler-mounts-sub"
    sub.mkdir(exist_ok=True)
    try:
        assert "not its mount point" in (shm_dir_mount_problem(str(sub)) or "")
        assert "not its mount point" in (tmpfs_mount_refusal(str(sub)) or "")
    finally:
        sub.rmdir()
    missing = tmp_path / "no-mountinfo"
    refusal = tmpfs_mount_refusal(str(shared_tmpfs), mountinfo_path=str(missing))
    assert refusal is not None and f"{missing} cannot be read" in refusal
