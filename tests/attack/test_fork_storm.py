"""Process churn as an unprivileged user never wedges the offload guard (issue 40, item 2).

``nobody`` forks a child every 2 ms, each living 0.3 s (a ``make -j`` does as much). Every listing of /proc then shows
new processes; the holder scan used to list again until none appeared, gave up after 16 listings, and every
inspection answered "source unavailable: proc": ``shm status`` failed, reclaims were refused, each pass of the loop
ended changing nothing and /healthz said 503 for as long as the churn ran. Now a listing whose processes were all
read ends the scan (docs/design.md, safety rule 2): under the same churn the status answers, a reclaim removes the
orphan and keeps the file a real process maps, and the loop converges with /healthz 200.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_helpers import MIB, LoopProcess, Root, make_file, wait_until

from attack.helpers import HOLDER, STORM, Attacker

pytestmark = [pytest.mark.root, pytest.mark.docker]


def _nobody_processes() -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                n += os.stat(f"/proc/{name}").st_uid == 65534
    return n


@pytest.fixture
def storm(attacker: Attacker) -> Iterator[Callable[[float], None]]:
    """Starts the fork storm as uid 65534 (one fork every 2 ms, children living 0.3 s) for at most ``total`` s and
    waits until it runs at full strength; the whole group is killed afterwards."""
    started: list[subprocess.Popen[str]] = []

    def start(total: float) -> None:
        p = attacker.popen(STORM, "0.002", "0.3", str(total))
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr and p.stderr.read()
        time.sleep(0.5)  # a child's life: from now on about 150 live at any moment, 500 new a second
        assert _nobody_processes() >= 50, "the fork storm did not start"

    try:
        yield start
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError):  # its session: the storm and every child it has left
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@pytest.fixture
def holder(root: Root) -> Iterator[Path]:
    """A real process mapping an offload file of the root's tmpfs for the whole test."""
    import sys

    path = root.shm / "vllm_offload_held.mmap"
    make_file(path, 4 * MIB)
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "mapped"
        yield path
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=10)


def test_shm_status_and_a_reclaim_answer_under_a_fork_storm(
    root: Root, holder: Path, storm: Callable[[float], None]
) -> None:
    orphan = root.shm / "vllm_offload_orphan.mmap"
    make_file(orphan, 2 * MIB)
    storm(60)
    for _ in range(3):
        r = root.cli("shm", "status", "--json")
        assert r.rc == 0, r
        assert r.data["sources"] == {"proc": "ok", "docker": "ok"}, r.data["sources"]
        states = {Path(f["path"]).name: f["state"] for f in r.data["files"]}
        assert states == {holder.name: "owned", orphan.name: "orphan"}, r.data["files"]
    r = root.cli("shm", "reclaim", "--confirm", "--json")
    assert r.rc == 0, r
    assert [Path(f["path"]).name for f in r.data["reclaimed"]] == [orphan.name], r.data
    assert root.shm_files() == [holder.name]
    assert _nobody_processes() >= 50, "the fork storm ended before the commands did: nothing was proven"


def test_the_loop_reclaims_and_converges_under_a_fork_storm(
    root: Root, holder: Path, storm: Callable[[float], None], start_loop: Callable[..., LoopProcess]
) -> None:
    """The loop starts under the churn: its first pass reclaims the orphan (two inspections, the write lease), keeps
    the mapped file and converges, /healthz is 200; an offload lane entered meanwhile converges too."""
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    orphan = root.shm / "vllm_offload_orphan.mmap"
    make_file(orphan, 8 * MIB)
    storm(90)
    lp = start_loop().started(timeout=60)
    (reclaimed,) = lp.wait("action", kind="reclaim", timeout=10)
    assert reclaimed["result"] == "ok" and "reclaimed 1 file(s)" in reclaimed["detail"], lp.log()
    assert root.shm_files() == [holder.name]
    _, health = wait_until(lambda: (h := lp.healthz())[0] == 200 and h, timeout=10, what="/healthz 200")
    assert health["last_pass"]["result"] == "converged", health
    mark = lp.mark()
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    (done,) = lp.wait("action", after=mark, kind="enter", timeout=60)
    assert done["result"] == "ok", lp.log()
    (finished,) = lp.wait("pass", after=mark, timeout=30)
    assert finished["result"] == "converged", lp.log()
    assert lp.healthz()[0] == 200 and holder.exists()
    assert _nobody_processes() >= 50, "the fork storm ended before the loop did: nothing was proven"
