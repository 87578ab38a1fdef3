"""Backoff on a virtual clock, and the host lock with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.backoff import Backoff
from reconciler.lock import HostLock, LockHeld


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_backoff_grows_exponentially_and_caps() -> None:
    clock = Clock()
    b = Backoff(base_s=10, factor=2, max_s=60, clock=clock)
    delays = []
    for _ in range(5):
        e = b.failed("r@a", recipe="r", recipe_hash="h1", error="crashed")
        delays.append(e.until - clock.t)
    assert delays == [10, 20, 40, 60, 60]
    assert "r@a" in b.holds() and "5 failed enter(s)" in b.holds()["r@a"]
    clock.t += 61
    assert b.holds() == {}


def test_backoff_resets_when_recipe_or_assignment_is_edited() -> None:
    clock = Clock()
    b = Backoff(clock=clock)
    b.failed("r@a", recipe="r", recipe_hash="h1", error="x")
    b.failed("q@b", recipe="q", recipe_hash="h9", error="x")
    assert b.forget_changed({"r@a": "h2", "q@b": "h9"}) == ["r@a"]  # recipe edited
    assert list(b.holds()) == ["q@b"]
    assert b.forget_changed({}) == ["q@b"]  # assignment removed
    # A failure after an edit starts again from the base delay.
    e = b.failed("r@a", recipe="r", recipe_hash="h2", error="x")
    assert e.failures == 1 and e.until - clock.t == b.base_s


def test_lock_refuses_second_holder_and_names_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECONCILER_LOCK_DIR", str(tmp_path))
    code = (
        "import sys,time; from reconciler.lock import HostLock\n"
        "l=HostLock('h', command='run').acquire(); print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(LockHeld) as exc:
            HostLock("h", command="apply").acquire()
        assert f"pid {holder.pid}" in str(exc.value) and "command run" in str(exc.value)
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing: its lock is simply taken over.
    with HostLock("h", command="apply") as lock:
        assert lock.path.read_text().startswith('{"pid": %d' % os.getpid())


def test_backoff_after_thousands_of_failures_stays_at_its_cap() -> None:
    # 2.0 ** 1024 overflows a float: a lane that failed that often raised on every later failure instead of waiting.
    clock = Clock()
    b = Backoff(clock=clock)  # the loop's defaults: 10 s doubling up to 600 s
    for _ in range(2000):
        e = b.failed("r@a", recipe="r", recipe_hash="h1", error="crashed")
    assert e.failures == 2000 and e.until - clock.t == 600
    assert "2000 failed enter(s)" in b.holds()["r@a"]
    # Any base and factor: the delay is computed without overflow and never exceeds the cap.
    for base, factor in ((1e-3, 10.0), (0.5, 1.0001), (10.0, 1e300), (700.0, 2.0), (10, 2)):
        odd = Backoff(base_s=base, factor=factor, max_s=600, clock=clock)
        for n in (1, 2, 1025, 5000):
            odd.entries.clear()
            for _ in range(n):
                e = odd.failed("r@a", recipe="r", recipe_hash="h1", error="x")
            assert 0 < e.until - clock.t <= 600
            assert n == 1 or e.until - clock.t >= min(600, base * factor) * 0.999  # it grew (float sums round)
