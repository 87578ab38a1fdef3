"""``plan --out`` onto what is not a plain file: the safe writer renamed a fresh file over whatever was there, so
``plan --out /dev/stdout`` replaced the ``/dev/stdout`` symlink with a root-only file. Now a terminal, a pipe or
``/dev/null`` (or a symlink of root's to one) is written to and stays what it was; a block device is refused,
naming it; a plain file is still written safely, and a symlink planted by another user is still replaced, never
followed. Each case a whole ``reconciler`` process; ``/dev/stdout`` itself in a mount namespace of the test's own,
so that nothing of the machine's /dev is at stake.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from e2e_helpers import Root

from attack.helpers import NOBODY, PRECIOUS, no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]


def _is_plan(text: str) -> None:
    """``text`` begins with a saved plan (on stdout the command's own text plan follows it)."""
    doc, _ = json.JSONDecoder().raw_decode(text)
    assert isinstance(doc, dict) and "plan" in json.dumps(doc), text[:500]


def test_the_process_own_stdout_gets_the_plan(root: Root) -> None:
    root.manifest()
    r = root.cli("plan", "--out", "/proc/self/fd/1")
    assert r.rc in (0, 2), r
    no_traceback(r.stderr)
    _is_plan(r.stdout)


def test_dev_stdout_is_written_to_and_stays_a_symlink(root: Root, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for a /dev of the test's own")
    root.manifest()
    script = (
        "set -e; mount -t tmpfs tmpfs /dev; ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr; "
        ': > "$OUT_NULL"; touch /dev/null; mount --bind "$OUT_NULL" /dev/null; '
        '"$@" plan --out /dev/stdout > "$OUT_FILE"; rc=$?; '
        "if [ -L /dev/stdout ]; then echo LINK; else echo REPLACED; fi"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *root.cli_args()],
        capture_output=True,
        text=True,
        timeout=120,
        env={**root.env, "OUT_FILE": str(tmp_path / "out.json"), "OUT_NULL": str(tmp_path / "null")},
        check=False,
    )
    no_traceback(proc.stderr)
    assert proc.stdout.strip().endswith("LINK"), (proc.stdout, proc.stderr)
    _is_plan((tmp_path / "out.json").read_text())


def test_a_pipe_and_dev_null_behind_symlinks_are_written_to(root: Root, tmp_path: Path) -> None:
    root.manifest()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    to_fifo = tmp_path / "to-fifo.plan"
    to_fifo.symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = root.cli("plan", "--out", str(to_fifo))
    reader.join(timeout=30)
    assert r.rc in (0, 2), r
    assert to_fifo.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode), "both stay what they were"
    _is_plan(got[0].decode())

    to_null = tmp_path / "to-null.plan"
    to_null.symlink_to("/dev/null")
    r = root.cli("plan", "--out", str(to_null))
    assert r.rc in (0, 2), r
    assert to_null.is_symlink() and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_block_device_is_refused_and_a_planted_symlink_replaced(root: Root, tmp_path: Path, precious: Path) -> None:
    root.manifest()
    disk = tmp_path / "disk"
    os.mknod(disk, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    r = root.cli("plan", "--out", str(disk))
    assert r.rc == 1 and f"{disk}: it is a block device" in r.stderr, r
    no_traceback(r.stderr)
    assert stat.S_ISBLK(os.lstat(disk).st_mode), "refused, not replaced"

    planted = tmp_path / "planted.plan"
    planted.symlink_to(precious)
    os.lchown(planted, NOBODY, NOBODY)
    r = root.cli("plan", "--out", str(planted))
    assert r.rc in (0, 2), r
    assert precious.read_text() == PRECIOUS, "the planted symlink was not followed"
    assert not planted.is_symlink() and stat.S_IMODE(os.lstat(planted).st_mode) == 0o600
    _is_plan(planted.read_text())

    plain = tmp_path / "plain.plan"
    r = root.cli("plan", "--out", str(plain))
    assert r.rc in (0, 2) and stat.S_IMODE(plain.stat().st_mode) == 0o600, r
    _is_plan(plain.read_text())
