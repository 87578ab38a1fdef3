"""The loop, for real: ``python -m reconciler --root ROOT run --log-format json`` as a process against the real
Docker engine, real fake-vllm containers and a real tmpfs (issue 5, "Tests, for real").

Each test has a root of its own (tests/e2e_helpers.py: own host name, tmpfs, GPU slot ids, ports and lock dir)
and starts the loop with ``LoopProcess``, which reads the loop's JSON log line by line as it is written and
scrapes its ``/metrics`` and ``/healthz``. A finalizer SIGTERMs every loop the test started and then removes
every container labelled with the test's host. Waits poll with short sleeps under overall deadlines.

The pure parts the loop adds (which refusal reason a blocked pass or a guarded reclaim counts) are tested on
values at the end of the file.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    Event,
    LoopProcess,
    Root,
    free_port,
    http_get,
    make_root,
    running_prometheus,
    wait_until,
)

from reconciler.apply.results import Outcome, PassResult
from reconciler.apply.shm_guard import _kept_from, compare_inspections, refusal_of
from reconciler.apply.shm_results import REFUSAL_CODES, KeptFile, ReclaimResult, RemovedFile
from reconciler.base.errors import ReconcilerError
from reconciler.loop import Loop
from reconciler.loop.backoff import Backoff
from reconciler.loop.hosting import Hosting
from reconciler.loop.log import Log
from reconciler.loop.metric_families import REFUSAL_REASONS
from reconciler.loop.refusals import pass_refusals, reclaim_refusals
from reconciler.model import DesiredAssignment, DesiredState, HostConfig
from reconciler.plan.actions import Action, ActionKind, Blocker, Plan
from reconciler.plan.causes import BlockerCause
from reconciler.plan.observed import Reading, ShmFile, ShmView, Tmpfs

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def root(
    tmp_path: Path, tmpfs_dir: Path, docker_api: Any, image: str, request: pytest.FixtureRequest
) -> Iterator[Root]:
    r = make_root(tmp_path, shm=tmpfs_dir, api=docker_api, name=request.node.name)
    try:
        yield r
    finally:
        r.cleanup()  # the tool's containers of this host, then the ones the test started by hand


def enters_ok(lp: LoopProcess, recipe: str, *, after: int = 0) -> list[Event]:
    return lp.find("action", after=after, kind="enter", result="ok", target=lambda t: t.startswith(recipe + "@"))


# ---------------------------------------------------------------- edits on disk converge


def test_an_edit_on_disk_converges_and_a_second_edit_switches_topology(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    lp = start_loop().started()
    assert root.containers() == [], "an empty manifest starts nothing"
    # The pass is logged just before it is counted: poll.
    # /healthz answers 200 as soon as the host is as wanted; the pass that found it so is counted just after.
    _, health = wait_until(
        lambda: (h := lp.healthz())[0] == 200 and h[1].get("passes", 0) >= 1 and h,
        timeout=10,
        what="/healthz 200 after a pass counted",
    )
    assert health["ok"] is True and health["passes"] >= 1 and health["last_pass"]["result"] == "converged", health
    assert lp.metric("reconciler_manifest_valid") == 1
    assert lp.metric("reconciler_drift") == 0

    # The split topology: omni on dark-compute-b. The save alone triggers the pass (resync is 60 s).
    mark = lp.mark()
    root.manifest((omni, [B]))
    (started,) = lp.wait("pass-start", after=mark, timeout=10)
    assert "file" in started["trigger"].split(","), started.data
    (done,) = lp.wait("action", after=mark, kind="enter", timeout=20)
    assert done["result"] == "ok" and done["target"] == f"{omni}@{B}", lp.log()
    omni_name = root.cname(omni, B)
    assert set(root.running()) == {omni_name}
    assert http_get(f"http://127.0.0.1:{root.port_of(omni)}/health")[0] == 200
    wait_until(lambda: lp.metric("reconciler_drift") == 0, timeout=5, what="drift 0 after the enter")
    assert _managed_owners(lp) == {(B, omni, omni_name)}, _series(lp, "reconciler_gpu_owner_info")

    # The exclusive TP=2 offload lane on both slots: omni leaves first, then the lane enters.
    mark = lp.mark()
    root.manifest((lane, [A, B]))
    lp.wait("action", after=mark, kind="enter", timeout=30)
    actions = [(e["kind"], e["target"], e["result"]) for e in lp.find("action", after=mark)]
    assert actions == [("leave", f"{omni}@{B}", "ok"), ("enter", f"{lane}@{A}+{B}", "ok")], lp.log()
    assert set(root.running()) == {root.cname(lane, A, B)}
    assert not [c for c in root.containers() if c["Names"][0].lstrip("/") == omni_name], "omni is removed"
    assert len(root.shm_files()) == 1, "the lane's one offload file, mapped by both workers"
    wait_until(lambda: lp.metric("reconciler_drift") == 0, timeout=5, what="drift 0 after the switch")
    assert lp.metric("reconciler_actions_total", kind="enter", result="ok") == 2
    assert lp.metric("reconciler_actions_total", kind="leave", result="ok") == 1
    assert lp.metric("reconciler_offload_files", state="owned") == 1
    lane_name = root.cname(lane, A, B)
    assert _managed_owners(lp) == {(A, lane, lane_name), (B, lane, lane_name)}, _series(lp, "reconciler_gpu_owner_info")
    assert lp.stop() == 0
    # The loop's exit tears nothing down: the lane keeps serving.
    assert set(root.running()) == {root.cname(lane, A, B)}
    assert lp.find("exit", reason="signal")


def _series(lp: LoopProcess, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in lp.samples() if n == name]


def _managed_owners(lp: LoopProcess) -> set[tuple[str, str, str]]:
    # Only this host's own containers: on a shared engine, other hosts' managed containers with the same slot
    # names may show up as "unmanaged" owners (see the report on metrics.gpu_owners and claimed_slots(host=)).
    return {
        (s["slot"], s["recipe"], s["container"])
        for s in _series(lp, "reconciler_gpu_owner_info")
        if s["owner"] == "managed"
    }


# ---------------------------------------------------------------- containers that die


def test_a_killed_container_is_brought_back(root: Root, start_loop: Callable[..., LoopProcess]) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    lp = start_loop("--backoff-base", "1").started()
    name = root.cname(omni, B)
    first = root.running()[name]["Id"]

    mark = lp.mark()
    subprocess.run(["docker", "kill", name], check=True, capture_output=True, timeout=30)
    (back,) = lp.wait("action", after=mark, kind="enter", result="ok", timeout=20)
    # The engine's die event woke the loop, not the 60 s resync; the kill counts once in the backoff.
    passed = lp.find("pass-start", after=mark)[0]
    assert any(t.startswith("docker-") for t in passed["trigger"].split(",")), passed.data
    (left,) = lp.find("action", after=mark, kind="leave")
    assert left["result"] == "ok" and "code 137" in left["reason"], left.data
    (counted,) = lp.find("backoff", after=mark)
    assert counted["failures"] == 1 and counted["assignment"] == f"{omni}@{B}", counted.data
    assert counted["until"] - 0.15 <= back.at < counted["until"] + 10, "brought back once its 1 s backoff ran out"
    now = root.running()
    assert set(now) == {name} and now[name]["Id"] != first
    assert http_get(f"http://127.0.0.1:{root.port_of(omni)}/health")[0] == 200
    # The killed one is kept (renamed) for its logs, and holds nothing.
    kept = [c for c in root.containers() if c["Id"] == first]
    assert len(kept) == 1 and kept[0]["State"] == "exited" and "-failed-" in kept[0]["Names"][0], kept


def test_a_recipe_that_keeps_dying_backs_off_with_growing_gaps(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    crashy = root.recipe("omni", mode="crash-after=1.5", settle_s=0.1)
    root.manifest((crashy, [B]))
    key = f"{crashy}@{B}"
    lp = start_loop("--backoff-base", "0.5", "--backoff-max", "30").started()
    # Each death counts (on a loaded host an enter may also fail when the crash beats its postcondition: that
    # counts the same way).
    backoffs = lp.wait("backoff", assignment=key, count=3, timeout=45)
    # While the third delay (2 s) runs, the recipe is held: the metric says so, with the time it ends.
    assert lp.metric("reconciler_recipe_backoff", recipe=crashy) == 1
    until = lp.metric("reconciler_recipe_backoff_until_timestamp_seconds", recipe=crashy)
    assert until is not None and until >= backoffs[2]["until"] - 0.1
    lp.wait("action-planned", kind="enter", after=lp.events.index(backoffs[2]), timeout=20)
    assert [e["failures"] for e in backoffs] == [1, 2, 3], lp.log()
    # The delay doubles (0.5, 1, 2 s), and no enter starts before its backoff ran out, so the gaps between
    # enters grow with it (the rest of a gap, the run, the leave and the start, depends on the machine's load).
    delays = [e["until"] - e.at for e in backoffs]
    for got, want in zip(delays, (0.5, 1.0, 2.0), strict=False):  # the first three; more may follow
        assert want - 0.2 < got <= want + 0.1, (delays, lp.log())
    starts = lp.find("action-planned", kind="enter")
    for i, b in enumerate(backoffs):
        before = [e for e in starts if e.at <= b.at][-1]
        after = lp.find("action-planned", kind="enter", after=lp.events.index(b))[0]
        assert after.at >= b["until"] - 0.1, (i, lp.log())
        assert after.at - before.at > 1.5 + delays[i], (i, lp.log())  # the run of 1.5 s, then the delay
    held = [e for e in lp.find("pass") if e["result"] == "held"]
    assert held and "in backoff after" in held[0]["message"], lp.log()

    # Once the delay ran out the recipe is no longer held (the alert clears), but its failures still count.
    assert (lp.metric("reconciler_recipe_enter_failures", recipe=crashy) or 0) >= 3
    loop_state = root.status()["loop"]
    assert loop_state is not None and loop_state["pid"] == lp.proc.pid, loop_state
    entry = loop_state["backoff"][key]
    assert entry["failures"] >= 3 and entry["recipe"] == crashy, entry
    assert "code 137" in entry["last_error"] or "fake crash" in entry["last_error"], entry

    # An edit of the recipe resets its backoff: the next try is immediate, not 30 s later, and counts from 1.
    lp.stop()
    lp = start_loop("--backoff-base", "30").started()
    lp.wait("backoff", assignment=f"{crashy}@{B}", failures=1, timeout=20)
    mark = lp.mark()
    edited = time.time()
    root.recipe("omni", mode="crash-after=2", settle_s=0.1)
    (reset,) = lp.wait("backoff-reset", after=mark, timeout=10)
    assert reset["assignment"] == f"{crashy}@{B}"
    (again,) = lp.wait("action", after=mark, kind="enter", result="ok", timeout=20)
    assert again.at - edited < 10, "entered at once after the edit, not after the 30 s backoff"
    (counted,) = lp.wait("backoff", after=mark, assignment=f"{crashy}@{B}", timeout=20)
    assert counted["failures"] == 1, counted.data


# ---------------------------------------------------------------- a broken edit


@pytest.mark.safety_rule(8)
def test_a_broken_manifest_tears_nothing_down_and_is_exported_until_fixed(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    lp = start_loop().started()
    name = root.cname(omni, B)
    cid = root.running()[name]["Id"]
    assert lp.metric("reconciler_manifest_valid") == 1

    # An unknown recipe on line 4 (which would also mean "omni leaves", if it were valid).
    mark = lp.mark()
    root.write_manifest_text(f"host: {root.host}\nassignments:\n  - gpus: [{A}]\n    recipe: no-such-recipe\n")
    (bad,) = lp.wait("config-invalid", after=mark, timeout=10)
    assert bad["path"].endswith("manifests/demo.yaml") and bad["line"] == 4, bad.data
    assert "no-such-recipe" in bad["error"], bad.data
    lp.wait("config-kept", after=mark, timeout=5)
    wait_until(lambda: lp.metric("reconciler_manifest_valid") == 0, timeout=5, what="manifest_valid 0")
    errors = _series(lp, "reconciler_manifest_error_info")
    assert len(errors) == 1 and "demo.yaml:4" in errors[0]["error"] and "no-such-recipe" in errors[0]["error"], errors
    assert (lp.metric("reconciler_manifest_last_error_timestamp_seconds") or 0) > time.time() - 60
    # /healthz, open to anyone: its verdict says the files are invalid (quoting nothing of them); its status is the
    # loop's own, alive and acting on the last valid desired state.
    code, health = lp.healthz()
    assert code == 200 and health["files"] == "invalid" and health["verdict"] == "invalid", health
    assert health["reason"].startswith("files invalid: the last valid desired state is kept"), health
    assert "no-such-recipe" not in json.dumps(health), health

    # Bad YAML: the same, with the line of the syntax error.
    mark = lp.mark()
    root.write_manifest_text(f"host: {root.host}\nassignments:\n  - recipe: [{omni}\n")
    (bad,) = lp.wait("config-invalid", after=mark, timeout=10)
    assert bad["path"].endswith("manifests/demo.yaml") and isinstance(bad["line"], int) and bad["line"] >= 3, bad.data
    # SIGHUP and a Docker event re-run passes on the kept desired state: still nothing torn down.
    lp.signal(signal.SIGHUP)
    time.sleep(0.5)
    assert lp.find("action", after=mark) == [], lp.log()
    assert root.running()[name]["Id"] == cid, "nothing torn down"
    assert lp.metric("reconciler_manifest_valid") == 0

    # Fixed: valid again, the error series is gone, and the edit is applied (omni moves to slot a).
    mark = lp.mark()
    root.manifest((omni, [A]))
    lp.wait("config-loaded", after=mark, timeout=10)
    lp.wait("action", after=mark, kind="enter", result="ok", timeout=20)
    assert lp.metric("reconciler_manifest_valid") == 1
    assert _series(lp, "reconciler_manifest_error_info") == []
    assert set(root.running()) == {root.cname(omni, A)}


# ---------------------------------------------------------------- one reconciler per host


@pytest.mark.safety_rule(8)
def test_a_second_run_is_refused_by_the_lock_naming_the_holder(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    lp = start_loop().started()
    second = root.cli("run", "--metrics-addr", f"127.0.0.1:{free_port()}", "--log-format", "json", timeout=30)
    assert second.rc == 1, str(second)
    assert f"pid {lp.proc.pid}" in second.stderr and "command run" in second.stderr, str(second)
    assert "one reconciler per host" in second.stderr
    # A stand-alone apply is refused the same way (the loop answers one that is not: tests/real/test_control.py), and
    # the first loop is unharmed.
    applied = root.cli("apply", "--yes", "--json", timeout=30, env={"RECONCILER_NO_LOOP": "1"})
    assert applied.rc == 1 and f"pid {lp.proc.pid}" in applied.stderr, str(applied)
    assert lp.proc.poll() is None
    assert lp.healthz()[0] == 200
    # Once the holder is gone its lock is free again.
    assert lp.stop() == 0
    again = start_loop().started()
    assert again.proc.poll() is None


# ---------------------------------------------------------------- signals


def test_sigterm_during_an_enter_exits_0_and_what_it_created_is_labelled(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    lane = root.recipe("deepseek-256k-offload", offload_mib=16, mode="start-delay=3")
    root.manifest((lane, [A, B]))
    name = root.cname(lane, A, B)
    lp = start_loop()
    lp.wait("action-planned", kind="enter", timeout=20)
    wait_until(lambda: name in root.running(), timeout=15, what=f"{name} running")
    assert not lp.find("action"), "still waiting for health (start-delay)"
    t0 = time.monotonic()
    assert lp.stop(timeout=15) == 0, lp.log()
    assert time.monotonic() - t0 < 5, "abandoned at the next safe point, not after the enter"
    (interrupted,) = lp.find("action", kind="enter")
    assert interrupted["result"] == "interrupted", interrupted.data
    assert lp.find("exit", reason="signal")

    survivor = root.running()[name]
    labels = survivor["Labels"]
    assert labels["io.reconciler.host"] == root.host and labels["io.reconciler.managed"] == "true"
    assert labels["io.reconciler.recipe"] == lane and labels["io.reconciler.slots"] == f"{A},{B}"
    assert labels["io.reconciler.install"] == root.install_id()
    # It never passed its health check, so a later apply does not take it as satisfied: it finishes the wait on
    # it (no second container, no restarted load), and the host converges once it is healthy.
    res = root.cli("apply", "--yes", "--json")
    assert res.rc == 0, str(res)
    assert [(a["kind"], a["result"], a["container_id"]) for a in res.data["actions"]] == [
        ("enter", "ok", survivor["Id"])
    ], str(res)
    assert http_get(f"http://127.0.0.1:{root.port_of(lane)}/health")[0] == 200
    assert [c["Id"] for c in root.containers()] == [survivor["Id"]]
    assert root.cli("plan", "--json").rc == 0


def test_sighup_triggers_a_pass(root: Root, start_loop: Callable[..., LoopProcess]) -> None:
    lp = start_loop().started()
    # An orphan offload file: nothing watches the shm dir, so only a pass notices it. Another Docker event on a
    # busy engine may run that pass first; then the next orphan is tried.
    for attempt in range(4):
        orphan = root.shm / f"vllm_offload_sighup{attempt}.mmap"
        orphan.write_bytes(b"\0" * 4096)
        mark = lp.mark()
        lp.signal(signal.SIGHUP)
        (done,) = lp.wait("action", after=mark, kind="reclaim", timeout=10)
        assert done["result"] == "ok", done.data
        assert not orphan.exists()
        started = lp.find("pass-start", after=mark)
        if started and "sighup" in started[0]["trigger"].split(","):
            break
    else:
        raise AssertionError(f"no pass ever named sighup as its trigger\n{lp.log()}")
    assert lp.proc.poll() is None, "SIGHUP does not stop the loop"
    assert (lp.metric("reconciler_reclaimed_bytes_total") or 0) >= 4096


def test_sigterm_ends_a_debounce_at_once(root: Root, start_loop: Callable[..., LoopProcess]) -> None:
    """A file edit starts the debounce (--debounce 60); SIGTERM during it exits within seconds, not after it."""
    lp = start_loop("--debounce", "60").started()
    root.manifest()  # an edit: the loop now waits for the files to be quiet for 60 s
    time.sleep(0.5)
    t0 = time.monotonic()
    assert lp.stop(timeout=15) == 0
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------- refusals are counted


def test_a_blocked_plan_counts_its_refusal_and_touches_nothing(
    root: Root, start_loop: Callable[..., LoopProcess], image: str
) -> None:
    # An unmanaged container on slot a's GPU; later a lane whose offload file does not fit what is left of the
    # tmpfs next to a file that is no offload file (so nothing may reclaim it).
    omni = root.recipe("omni")
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    root.run_unmanaged(
        "unmanaged", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}", "-v", "/usr:/usr:ro", image, "sleep", "300"
    )
    root.manifest((omni, [A]))
    lp = start_loop().started()
    assert lp.metric("reconciler_refusals_total", reason="gpu_held") >= 1
    assert lp.metric("reconciler_blocked_changes") == 1
    assert root.containers() == [], "nothing entered on a held GPU"

    held_before = lp.metric("reconciler_refusals_total", reason="gpu_held") or 0
    (root.shm / "ballast.bin").write_bytes(b"\1" * (52 << 20))
    mark = lp.mark()
    root.manifest((lane, [A, B]))
    (blocked,) = lp.wait("pass", after=mark, result="blocked", timeout=10)
    assert "tmpfs" in blocked["message"] and f"unmanaged-{root.tag}" in blocked["message"], blocked.data
    assert lp.metric("reconciler_refusals_total", reason="tmpfs_room") >= 1
    assert (lp.metric("reconciler_refusals_total", reason="gpu_held") or 0) > held_before
    assert root.containers() == []
    assert root.shm_files() == ["ballast.bin"]
    for reason in REFUSAL_REASONS:
        assert lp.metric("reconciler_refusals_total", reason=reason) is not None, reason


# ---------------------------------------------------------------- Prometheus


def test_promtool_finds_nothing_to_complain_about_in_a_live_scrape(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (.ci/setup-host does)"
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    lp = start_loop().started()
    text = lp.scrape()
    assert "reconciler_reconcile_passes_total" in text and "process_resident_memory_bytes" in text
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stdout + done.stderr
    assert lp.healthz()[0] == 200
    assert http_get(f"http://{lp.addr}/nope")[0] == 401  # fail closed: only /metrics and /healthz need no token


def test_a_real_prometheus_scrapes_the_live_loop(
    root: Root, start_loop: Callable[..., LoopProcess], tmp_path: Path
) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    lp = start_loop().started()
    with running_prometheus(lp.addr, tmp_path) as (base, proc):

        def query(q: str) -> list[dict[str, Any]]:
            status, body = http_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}")
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            return json.loads(body)["data"]["result"] if status == 200 else []

        up = wait_until(lambda: query('up{job="reconciler"} == 1'), timeout=30, what="up == 1", every=0.3)
        assert up[0]["metric"]["instance"] == lp.addr
        owner = wait_until(
            lambda: query(f'reconciler_gpu_owner_info{{slot="{B}",owner="managed"}}'),
            timeout=10,
            what="owner",
            every=0.3,
        )
        assert owner[0]["metric"]["recipe"] == omni
        valid = query("reconciler_manifest_valid")
        assert [float(r["value"][1]) for r in valid] == [1.0]
        passes = query('sum(reconciler_reconcile_passes_total{result=~"converged|changed"})')
        assert float(passes[0]["value"][1]) >= 1
        _, body = http_get(f"{base}/api/v1/targets")
        (target,) = json.loads(body)["data"]["activeTargets"]
        assert target["health"] == "up" and target["lastError"] == "", target


# ---------------------------------------------------------------- which refusal reason (pure)


def _plan(*blockers: Blocker, unavailable: tuple[str, ...] = ()) -> Plan:
    return Plan(host="h", blockers=blockers, unavailable=unavailable)


def test_pass_refusals_name_what_stands_in_the_way() -> None:
    held = Blocker(
        "omni",
        (A,),
        "jupyter holds GPU slot dark-compute-a and is not managed by this tool",
        "jupyter",
        cause=BlockerCause.HELD,
    )
    pid = Blocker(
        "omni", (A,), "pid 4242 in no container uses GPU slot dark-compute-a", "pid 4242", cause=BlockerCause.HELD
    )
    room = Blocker("lane", (A, B), "tmpfs /dev/shm would have 1 GiB free ...", "tmpfs", cause=BlockerCause.TMPFS)
    nvml = Blocker(
        "omni", (A,), "GPU telemetry (nvml) unavailable: NVML: Driver Not Loaded", "", cause=BlockerCause.UNSEEN
    )

    def result(kind: str, p: Plan) -> PassResult:
        return PassResult(kind, p, p)

    assert pass_refusals(result("blocked", _plan(held, pid, room))) == ["gpu_held", "tmpfs_room"]
    assert pass_refusals(result("blocked", _plan(nvml))) == ["source_unavailable"]
    assert pass_refusals(result("error", _plan(unavailable=("docker",)))) == ["source_unavailable"]
    assert pass_refusals(result("converged", _plan())) == []
    assert pass_refusals(result("failed", _plan(held))) == []  # a failed action is not a refusal
    for reasons in (["gpu_held", "tmpfs_room", "source_unavailable"],):
        assert set(reasons) <= set(REFUSAL_REASONS)


def _file(path: str, *, inode: int = 7, size: int = 4096, state: str = "orphan") -> ShmFile:
    return ShmFile(path, 1, inode, size, size, (), state, "")


def _view(*files: ShmFile) -> ShmView:
    ok = Reading("proc", True)
    return ShmView(
        dir="/s",
        pattern="vllm_offload_*.mmap",
        tmpfs=Tmpfs(1, 0, 1),
        proc=ok,
        docker=Reading("docker", True),
        files=files,
    )


def _result(**kw: Any) -> ReclaimResult:
    return ReclaimResult(confirmed=True, dir="/s", pattern="vllm_offload_*.mmap", **kw)


def test_reclaim_refusals_map_the_guards_reasons() -> None:
    a, b, c = "/s/vllm_offload_a.mmap", "/s/vllm_offload_b.mmap", "/s/vllm_offload_c.mmap"
    first = [_file(a, inode=1), _file(b, inode=2), _file(c, inode=3)]
    # The guard's own comparison: a replaced (inspections disagree), b gained an owner, c unchanged.
    second = _view(_file(a, inode=9), _file(b, inode=2, state="owned"), _file(c, inode=3))
    agreed, kept = compare_inspections(first, second)
    assert [f.path for f in agreed] == [c]
    res = _result(
        candidates=tuple(RemovedFile(f.path, f.size_bytes, f.allocated_bytes, 1, f.inode) for f in first),
        reclaimed=(RemovedFile(c, 4096, 4096, 1, 3),),
        kept=(*kept, KeptFile("/s/vllm_offload_x.mmap", "owned by pid 5 (map)", "owned")),
        verified=True,
    )
    assert reclaim_refusals(res) == ["file_owned", "inspections_disagree"]

    assert reclaim_refusals(_result(reclaimed=(RemovedFile(c, 1, 1, 1, 3),), verified=True)) == []

    # A whole reclaim refused: the guard's refusal carries its code, which is what is counted.
    def refused(view: ShmView) -> list[str]:
        r = refusal_of(view)
        assert r is not None
        return reclaim_refusals(_result(refused=r.text, refused_code=r.code))

    assert refused(replace(_view(), blocking_containers=("lane",))) == ["offload_container_running"]
    assert refused(replace(_view(), docker=Reading("docker", False, "connection refused", cause="down"))) == [
        "source_unavailable"
    ]
    stuck = Reading("proc", False, "pid 77 (python3) cannot be inspected: Permission denied", cause="uninspectable")
    assert refused(replace(_view(), proc=stuck)) == ["uninspectable_process"]
    assert refused(replace(_view(), proc=Reading("proc", False, "/proc did not settle"))) == ["source_unavailable"]
    # A pattern match that is no plain file, kept from the first inspection: its code.
    skipped = replace(_view(), skipped=(("/s/vllm_offload_l.mmap", "a symlink (to '/etc'): never followed"),))
    assert reclaim_refusals(_result(kept=tuple(_kept_from(skipped)))) == ["invalid_entry"]
    gone = _result(candidates=(RemovedFile(a, 1, 1, 1, 1),), kept=(KeptFile(a, "gone before removal", "gone"),))
    assert reclaim_refusals(gone) == []
    # An orphan the first inspection did not see: the two inspections disagree.
    _, late = compare_inspections([], _view(_file(b, inode=2)))
    assert reclaim_refusals(_result(kept=tuple(late))) == ["inspections_disagree"]
    # The words alone count nothing: no layer reads a refusal back from its sentence.
    assert reclaim_refusals(_result(refused="docker unavailable: connection refused")) == []
    words = KeptFile(b, "appeared or became unowned after the first inspection", "orphan")
    assert reclaim_refusals(_result(kept=(words,))) == []
    # Every code the guard can give is a reason the metrics know.
    assert set(REFUSAL_CODES) <= set(REFUSAL_REASONS)


def test_reclaim_refusals_on_a_real_unlink_race(tmp_path: Path) -> None:
    # The guard's last re-check before unlink: a file replaced under the same name is kept, counted file_owned.
    from reconciler.apply.shm_guard import _dir_identity
    from reconciler.apply.shm_unlink import _unlink_agreed

    d = tmp_path / "shm"
    d.mkdir()
    p = d / "vllm_offload_r.mmap"
    p.write_bytes(b"\0" * 4096)
    st = os.stat(p)
    inspected = ShmFile(str(p), st.st_dev, st.st_ino, st.st_size, st.st_blocks * 512, (), "orphan", "")
    other = d / "new"
    other.write_bytes(b"\0" * 4096)
    other.replace(p)  # same name, another inode (made while the first still existed, so never reused)
    removed, kept, errors = _unlink_agreed(str(d), _dir_identity(str(d)), [inspected])
    assert removed == [] and errors == [] and p.exists()
    res = _result(candidates=(RemovedFile(str(p), 4096, 4096, st.st_dev, st.st_ino),), kept=tuple(kept))
    assert reclaim_refusals(res) == ["file_owned"]


# ---------------------------------------------------------------- the loop's backoff bookkeeping (in process)


def _quiet_loop(tmp_path: Path, **kw: Any) -> Loop:
    return Loop(str(tmp_path), log=Log("json", io.StringIO()), **kw)


class _FrontEnd:
    """A front-end that records what the loop does with it."""

    def __init__(self, name: str, events: list[tuple[str, ...]], *, fails: bool = False):
        self.name, self.events, self.fails, self.up = name, events, fails, True
        self.hosting: Hosting | None = None

    def start(self, hosting: Hosting) -> None:
        self.events.append(("start", self.name, hosting.host))
        self.hosting = hosting
        if self.fails:
            raise ReconcilerError(f"{self.name} cannot start")

    def alive(self) -> bool:
        return self.up

    def close(self) -> None:
        self.events.append(("close", self.name))


def test_the_loop_starts_the_front_ends_it_hosts_in_order_and_closes_them_in_reverse(tmp_path: Path) -> None:
    events: list[tuple[str, ...]] = []
    http, control = _FrontEnd("http", events), _FrontEnd("control", events)
    loop = _quiet_loop(tmp_path, front_ends=[http, control])
    loop._start_front_ends("h")
    assert events == [("start", "http", "h"), ("start", "control", "h")]
    assert control.hosting is not None and control.hosting.pass_lock is loop.pass_lock, "the loop's own pass lock"
    assert loop._well()
    control.up = False
    assert not loop._well(), "a front-end that stopped serving fails the watchdog"
    loop._close_front_ends()
    assert events[2:] == [("close", "control"), ("close", "http")]
    # One that cannot start: those started before it are closed, the later ones never start, and its error ends
    # the loop's start.
    events.clear()
    failing = [_FrontEnd("http", events), _FrontEnd("control", events, fails=True), _FrontEnd("third", events)]
    loop = _quiet_loop(tmp_path, front_ends=failing)
    with pytest.raises(ReconcilerError, match="control cannot start"):
        loop._start_front_ends("h")
    assert events == [("start", "http", "h"), ("start", "control", "h"), ("close", "http")]
    loop._close_front_ends()
    assert len(events) == 3, "closed once"


def test_an_enter_held_by_a_backoff_that_ran_out_during_the_pass_is_tried_at_once(tmp_path: Path) -> None:
    loop = _quiet_loop(tmp_path, resync_s=60)
    loop.backoff.failed("omni@b", recipe="omni", recipe_hash="h", error="exited with code 137")
    loop.backoff.entries["omni@b"].until = time.time() - 0.5  # ran out while the pass that held it ran
    loop._held = {"omni@b"}
    t0 = time.monotonic()
    loop._wait()
    assert time.monotonic() - t0 < 1, "woke at once, not at the 60 s resync"
    assert loop.triggers.take()[0] == {"backoff"}
    # Nothing held and nothing pending: only the resync timer wakes it.
    loop = _quiet_loop(tmp_path, resync_s=0.2)
    loop.backoff.failed("omni@b", recipe="omni", recipe_hash="h", error="x")
    loop.backoff.entries["omni@b"].until = time.time() - 0.5
    t0 = time.monotonic()
    loop._wait()
    assert time.monotonic() - t0 >= 0.19
    assert loop.triggers.take()[0] == {"resync"}


def test_a_crashed_container_counts_once_in_the_backoff_before_its_leave_runs(tmp_path: Path) -> None:
    loop = _quiet_loop(tmp_path, backoff=Backoff(base_s=10, clock=lambda: 1000.0))
    host = HostConfig.model_validate({"name": "h", "gpus": {A: {"index": 0}, B: {"index": 1}}, "gpu_telemetry": "none"})
    desired = DesiredState(host=host, recipes={}, assignments=(DesiredAssignment("omni", (B,), "hash1", 0),))

    def leave(cid: str, reason: str, recipe: str = "omni", exit_code: int | None = None) -> Plan:
        a = Action(
            ActionKind.LEAVE,
            reason,
            recipe=recipe,
            gpus=(B,),
            container=f"c-{cid}",
            container_id=cid,
            recipe_hash="hash1",
            exit_code=exit_code,
        )
        return Plan(host="h", actions=(a,))

    # The crash is data the planner carries (the code its container exited with), never read back from the words.
    assert (
        loop.failures.crashes(desired, leave("c0", "reconciler-omni-dark-compute-b is exited with code 137")) is False
    )
    crashed = leave("c1", "reconciler-omni-dark-compute-b is exited with code 137", exit_code=137)
    assert loop.failures.crashes(desired, crashed) is True
    assert loop.backoff.entries[f"omni@{B}"].failures == 1
    assert f"omni@{B}" in loop.backoff.holds(), "the enter of this very pass is held"
    # The same container planned to leave again (its leave failed): not counted twice.
    assert loop.failures.crashes(desired, crashed) is False
    assert loop.backoff.entries[f"omni@{B}"].failures == 1
    # The next crash is another container: counted, and the delay doubles.
    assert loop.failures.crashes(
        desired, leave("c2", "reconciler-omni-dark-compute-b is exited with code 1", exit_code=1)
    )
    e = loop.backoff.entries[f"omni@{B}"]
    assert (e.failures, e.until) == (2, 1020.0)
    # A clean exit, a recipe not in the manifest, a container never started: no failure.
    assert (
        loop.failures.crashes(desired, leave("c3", "reconciler-omni-dark-compute-b is exited with code 0", exit_code=0))
        is False
    )
    assert (
        loop.failures.crashes(desired, leave("c4", "x is exited with code 137", recipe="gone", exit_code=137)) is False
    )
    assert loop.failures.crashes(desired, leave("c5", "x was created but never started")) is False
    assert loop.backoff.entries[f"omni@{B}"].failures == 2
    assert loop.metrics.backoff_failures.labels(recipe="omni")._value.get() == 2


_SIGNAL_WHILE_LOGGING = """
import io, os, signal
from reconciler.loop import Loop
from reconciler.loop.log import Log
loop = Loop("/nonexistent", log=Log("json", io.StringIO()))
loop._install_signals()
with loop.log._lock:  # the main thread is writing a log line when the signals come
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGTERM)
    step = 1  # the handlers run here, between two bytecodes
print("stopped" if loop.stop.wait(5) else "not stopped", sorted(loop.triggers.reasons))
"""


def test_a_signal_that_comes_while_the_loop_writes_a_log_line_does_not_deadlock() -> None:
    # The handler used to log (and fire triggers) itself, taking locks the interrupted main thread may hold.
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_WHILE_LOGGING], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "stopped" and "sighup" in done.stdout, done.stdout


def test_every_pass_verdict_has_its_metric_label() -> None:
    """The two vocabularies held together: each verdict a pass can end with (apply.results.PassVerdict) is counted
    under one label of reconciler_passes_total{result}, and a pass that converged after changing something is
    "changed", one that changed nothing "converged"."""
    from reconciler.apply.results import PASS_VERDICTS
    from reconciler.loop.metric_families import PASS_RESULTS
    from reconciler.loop.pass_labels import PASS_LABEL as _PASS_LABEL
    from reconciler.loop.pass_labels import pass_label as _pass_label

    assert set(_PASS_LABEL) == set(PASS_VERDICTS)
    assert set(_PASS_LABEL.values()) <= set(PASS_RESULTS)
    empty = Plan(host="h", actions=(), blockers=())
    done = Outcome(Action(ActionKind.LEAVE, "r", ("a",), "c", (), "why"), "ok", 1.0)
    assert _pass_label(PassResult("converged", empty, empty)) == "converged"
    assert _pass_label(PassResult("converged", empty, empty, [done])) == "changed"
    assert _pass_label(PassResult("changed", empty, empty, [done])) == "failed"
