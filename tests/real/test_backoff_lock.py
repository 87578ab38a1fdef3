"""Backoff on a virtual clock, and the host lock with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.loop.backoff import Backoff
from reconciler.loop.log import Log
from reconciler.store.lock import HostLock, LockHeld


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
        "import sys,time; from reconciler.store.lock import HostLock\n"
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
        assert lock.path.read_text().startswith(f'{{"pid": {os.getpid()}')


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


def test_a_failing_fallback_backs_off_longer_while_the_lane_it_serves_is_held() -> None:
    # The manifest wants big on a+b; it failed and is held, and small on b (the last converged topology's lane)
    # serves meanwhile. small@b is no manifest key: each pass used to forget its entry, so a fallback that kept
    # failing was retried at the base delay for as long as big was held.
    clock = Clock()
    b = Backoff(base_s=10, factor=2, max_s=600, clock=clock)
    manifest = {"big@a+b": "hb"}
    recipes = {"big": "hb", "small": "hs", "other": "ho"}
    b.failed("big@a+b", recipe="big", recipe_hash="hb", error="exited with code 1")
    delays = []
    for _ in range(4):  # one loop pass each: forget what was edited, then the fallback's enter fails again
        assert b.forget_changed(manifest, recipes=recipes) == []
        if "small@b" in b.holds():
            clock.t = b.entries["small@b"].until  # its backoff ran out: the next pass tries it again
        e = b.failed("small@b", recipe="small", recipe_hash="hs", error="exited with code 1")
        delays.append(e.until - clock.t)
    assert delays == [10, 20, 40, 80]
    assert "small@b" in b.holds()
    # A lane whose slots no held lane covers, or whose recipe is gone or edited, is forgotten as before.
    b.failed("other@c", recipe="other", recipe_hash="ho", error="x")
    b.failed("gone@a", recipe="gone", recipe_hash="hg", error="x")
    assert sorted(b.forget_changed(manifest, recipes=recipes)) == ["gone@a", "other@c"]
    assert b.forget_changed(manifest, recipes={**recipes, "small": "hs2"}) == ["small@b"]
    # Without recipes (a caller that knows none), only manifest keys stay.
    b.failed("small@b", recipe="small", recipe_hash="hs", error="x")
    assert b.forget_changed(manifest) == ["small@b"]
    # Once the held lane's own entry is gone (edited, or it ran long enough to be cleared), so is its fallback's.
    b.failed("small@b", recipe="small", recipe_hash="hs", error="x")
    assert sorted(b.forget_changed({"big@a+b": "hb2"}, recipes=recipes)) == ["big@a+b", "small@b"]
    b.failed("big@a+b", recipe="big", recipe_hash="hb", error="x")
    b.failed("small@b", recipe="small", recipe_hash="hs", error="x")
    assert b.succeeded("big@a+b")
    assert b.forget_changed(manifest, recipes=recipes) == ["small@b"]


def test_a_loop_pass_keeps_the_backoff_of_the_fallback_of_a_held_lane(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    from planner_fixtures import make_recipe

    from reconciler.loop import loop as loop_mod
    from reconciler.model import DesiredAssignment, DesiredState, HostConfig

    a, b = "dark-compute-a", "dark-compute-b"
    big, small = make_recipe(tp=2, image="big"), make_recipe(image="small")
    host = HostConfig.model_validate({"name": "h", "gpus": {a: {"index": 0}, b: {"index": 1}}, "gpu_telemetry": "none"})
    desired = DesiredState(
        host=host,
        recipes={"big": big, "small": small},
        assignments=(DesiredAssignment("big", (a, b), big.content_hash(), 0),),
    )
    loop = loop_mod.Loop(str(tmp_path), log=Log("json", io.StringIO()), backoff=Backoff(clock=Clock()))
    monkeypatch.setattr(loop, "_load", lambda: desired)

    class PassEnds(Exception):
        pass

    def applier(*_args: object, **_kw: object) -> None:
        raise PassEnds  # the pass stops here: what it did to the backoff before it is under test

    monkeypatch.setattr(loop_mod, "Applier", applier)
    loop.backoff.failed(f"big@{a}+{b}", recipe="big", recipe_hash=big.content_hash(), error="x")
    for _ in range(3):
        loop.backoff.failed(f"small@{b}", recipe="small", recipe_hash=small.content_hash(), error="x")
        assert loop.cycle({"resync"}) is None
    assert loop.backoff.entries[f"small@{b}"].failures == 3


def test_a_wall_clock_stepped_back_never_lengthens_a_backoff() -> None:
    """The delay runs on the wall clock (it outlives a restart); stepped back a day after one failure (NTP, a VM
    resumed, date -s), the lane waited that day plus its 10 s. A wait never exceeds its delay from now."""
    now = [1_000_000.0]
    b = Backoff(base_s=10, clock=lambda: now[0])
    b.failed("omni@a", recipe="omni", recipe_hash="h", error="boom")
    now[0] -= 86400.0
    assert "next try in 10 s" in b.holds()["omni@a"]
    now[0] += 11.0
    assert b.holds() == {}
    now[0] += 86400.0  # stepped forward again: still nothing held, and a new failure waits its own delay
    assert b.holds() == {}
    b.failed("omni@a", recipe="omni", recipe_hash="h", error="boom")
    assert "next try in 20 s" in b.holds()["omni@a"]
