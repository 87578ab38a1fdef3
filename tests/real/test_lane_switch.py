"""A lane switch you can trust, against the real engine and a real tmpfs: functional probes before an enter counts,
a drain before a leave, and the fallback to the last converged topology while a failed lane waits in backoff.

The lanes are fake vLLM containers (examples/fake-vllm) made from the demo's recipes (tests/e2e_helpers.py), which
carry the report's preflight (models, smoke, structured JSON, streaming, 8K retrieval, tools, streaming tools,
tool-result continuation, Responses) and its regression suite; FAKE_VLLM_MODE switches break one of them, ``fake_hold_s``
in a request keeps it in flight until ``POST /fake/release``, and ``--max-num-seqs 1`` makes a second one wait.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from e2e_helpers import LoopProcess, Root, http_get, wait_until

A, B = "dark-compute-a", "dark-compute-b"


def post(url: str, body: dict[str, Any], *, timeout: float = 90) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def gauges(port: int) -> tuple[float, float] | None:
    from reconciler.apply.vllm_metrics import read_gauges

    got = read_gauges(f"http://127.0.0.1:{port}/metrics")
    return None if isinstance(got, str) else got


class Clients:
    """Requests held in flight in the lane (``fake_hold_s``), each in a thread of its own."""

    def __init__(self, port: int, model: str, n: int, *, hold_s: float):
        self.port = port
        self.answers: dict[int, tuple[int, Any]] = {}
        self.threads = [threading.Thread(target=self._ask, args=(i, model, hold_s), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _ask(self, i: int, model: str, hold_s: float) -> None:
        self.answers[i] = post(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            {"model": model, "fake_hold_s": hold_s, "messages": [{"role": "user", "content": f"request {i}"}]},
        )

    def release(self) -> bool:
        """Let the held requests go on; True once every client has its answer."""
        post(f"http://127.0.0.1:{self.port}/fake/release", {}, timeout=2)
        return not any(t.is_alive() for t in self.threads)


# ---------------------------------------------------------------- probes


def test_an_enter_whose_structured_json_probe_fails_is_a_failed_enter(root: Root) -> None:
    omni = root.recipe("omni", mode="bad-json")
    root.manifest((omni, [B]))
    r = root.apply()
    assert r.rc == 1, r
    (enter,) = [a for a in r.data["actions"] if a["kind"] == "enter"]
    assert enter["result"] == "failed", enter
    # The reason names the probe and quotes what came back, not a line of the engine's log.
    assert "probe 'structured-json' (chat) failed: the answer is not JSON" in enter["detail"], enter["detail"]
    assert '{"answer": "truncated' in enter["detail"], enter["detail"]
    assert "Kept as reconciler-" in enter["detail"], enter["detail"]
    if "probes" in enter:  # the probes run before it, passed, are in the outcome
        assert [(p["name"], p["ok"]) for p in enter["probes"]] == [
            ("models", True),
            ("smoke", True),
            ("structured-json", False),
        ]
    # A failed enter: the container is kept, stopped, for its logs; nothing runs on the slot.
    assert root.running() == {}
    kept = [c for c in root.containers() if "-failed-" in c["Names"][0]]
    assert len(kept) == 1 and kept[0]["State"] == "exited", kept
    assert root.status()["slots"][B]["free"] is True


def test_reconciler_probe_runs_the_recipes_probes_against_its_running_lane(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    assert root.apply().rc == 0
    r = root.cli("probe", omni, "--json")
    assert r.rc == 0, r
    assert [(p["name"], p["ok"]) for p in r.data["probes"]] == [
        ("models", True),
        ("smoke", True),
        ("structured-json", True),
        ("streaming", True),
        ("retrieval-8k", True),
        ("tools", True),
        ("streaming-tools", True),
        ("tool-result", True),
        ("responses", True),
    ], r.data
    assert r.data["containers"] == [root.cname(omni, B)] and r.data["suite"] == "preflight"
    human = root.cli("probe", omni)
    assert human.rc == 0 and "9/9 probe(s) passed" in human.stdout, human
    # A recipe whose lane does not run: every probe fails, saying nothing answered; exit 1.
    idle = root.recipe("deepseek-256k-offload", offload_mib=16)
    r = root.cli("probe", idle, "--json")
    assert r.rc == 1 and r.data["containers"] == [] and not any(p["ok"] for p in r.data["probes"]), r
    assert all("no answer from http://127.0.0.1:" in p["detail"] for p in r.data["probes"]), r.data
    human = root.cli("probe", idle)
    assert human.rc == 1 and human.stdout.count("no answer from") == 1, human
    assert "FAIL not running: none of the" in human.stdout and "no running container of it" in human.stdout, human
    assert root.cli("probe", "no-such-recipe").rc == 1


# ---------------------------------------------------------------- drain


def test_a_leave_waits_for_two_held_requests_and_the_clients_get_their_answers(root: Root) -> None:
    omni = root.recipe("omni", args=["--max-num-seqs", "1"], drain_timeout_s=60)
    root.manifest((omni, [B]))
    assert root.apply().rc == 0
    port = root.port_of(omni)
    clients = Clients(port, f"e2e/{omni}", 2, hold_s=120)
    wait_until(lambda: gauges(port) == (1.0, 1.0), timeout=10, what="one request running, one waiting")

    root.manifest()  # the split topology no more: omni must leave
    t0 = time.monotonic()
    proc = subprocess.Popen(
        root.cli_args("apply", "--yes", "--json"),
        env=root.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.0)
        assert proc.poll() is None, "the leave waits while requests are in flight"
        assert root.cname(omni, B) in root.running(), "nothing is stopped while it drains"
        wait_until(clients.release, timeout=20, what="both held requests answered", every=0.3)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    (leave,) = json.loads(out)["actions"]
    assert leave["kind"] == "leave" and leave["result"] == "ok", leave
    assert leave["detail"].startswith("drained 2 request(s) in "), leave["detail"]
    assert time.monotonic() - t0 >= 2.0
    if "drain" in leave:
        assert leave["drain"]["drained"] is True and leave["drain"]["requests_at_start"] == 2, leave["drain"]
    # The clients got their answers, complete.
    assert {i: (s, a["choices"][0]["message"]["content"]) for i, (s, a) in clients.answers.items()} == {
        0: (200, f"Fake answer from e2e/{omni}: request 0"),
        1: (200, f"Fake answer from e2e/{omni}: request 1"),
    }
    assert root.running() == {}
    # The drain is in the audit trail's record of the apply.
    audit = root.cli("audit", "--json")
    assert audit.rc == 0 and "drained 2 request(s)" in json.dumps(audit.data["records"][-1]), audit.data


@pytest.mark.safety_rule(7)
def test_a_drain_that_times_out_stops_the_lane_anyway_and_says_so(root: Root) -> None:
    omni = root.recipe("omni", drain_timeout_s=1.5)
    root.manifest((omni, [B]))
    assert root.apply().rc == 0
    port = root.port_of(omni)
    clients = Clients(port, f"e2e/{omni}", 2, hold_s=300)
    wait_until(lambda: gauges(port) == (2.0, 0.0), timeout=10, what="two requests running")
    root.manifest()
    r = root.apply()
    assert r.rc == 0, r
    (leave,) = r.data["actions"]
    assert leave["result"] == "ok" and leave["seconds"] >= 1.5, leave
    assert leave["detail"].startswith("drain timed out after 1.5 s with 2 running and 0 waiting: stopped anyway; "), (
        leave["detail"]
    )
    if "drain" in leave:
        assert leave["drain"]["timed_out"] is True and leave["drain"]["drained"] is False, leave["drain"]
    assert root.running() == {}
    for t in clients.threads:
        t.join(timeout=10)
    assert all(status != 200 for status, _ in clients.answers.values()), "cut off by the stop"


def test_a_lane_with_drain_disabled_or_not_answering_is_stopped_without_a_drain(root: Root) -> None:
    omni = root.recipe("omni")
    data = root.recipe_data(omni)
    data["drain"] = {"enabled": False}
    root.write_recipe(omni, data)
    root.manifest((omni, [B]))
    assert root.apply().rc == 0
    clients = Clients(root.port_of(omni), f"e2e/{omni}", 1, hold_s=300)
    wait_until(lambda: gauges(root.port_of(omni)) == (1.0, 0.0), timeout=10, what="a request running")
    root.manifest()
    r = root.apply()
    assert r.rc == 0, r
    (leave,) = r.data["actions"]
    assert leave["detail"].startswith("not drained: drain.enabled = false in its recipe; "), leave["detail"]
    assert leave["seconds"] < 10
    clients.threads[0].join(timeout=10)

    # A lane whose metrics do not answer (here: the URL points at a closed port) is stopped at once, not waited on.
    lane = root.recipe("omni")
    data = root.recipe_data(lane)
    data["drain"] = {"metrics_url": "http://127.0.0.1:9/metrics"}
    root.write_recipe(lane, data)
    root.manifest((lane, [B]))
    assert root.apply().rc == 0
    root.manifest()
    r = root.apply()
    (leave,) = r.data["actions"]
    assert leave["result"] == "ok" and leave["detail"].startswith(
        "not drained: http://127.0.0.1:9/metrics did not answer"
    ), leave


# ---------------------------------------------------------------- fallback


def test_a_failed_tp2_enter_brings_omni_back_in_the_same_pass_and_the_next_attempt_enters_once_fixed(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    # The TP=2 lane fails at start while this file exists: a fault fixed on the host, without editing the recipe
    # (an edit would reset the backoff), so the next attempt comes when its backoff runs out.
    fault = root.shm / "lane-fault"
    fault.write_text("fail-start\n")
    lane = root.recipe("deepseek-256k-offload", offload_mib=16, env={"FAKE_VLLM_MODE_FILE": str(fault)})
    lp = start_loop("--backoff-base", "10").started()
    mark = lp.mark()
    root.manifest((omni, [B]))
    lp.wait("pass", after=mark, result="converged", timeout=60)
    assert set(root.running()) == {root.cname(omni, B)}

    mark = lp.mark()
    root.manifest((lane, [A, B]))
    (failed_pass,) = lp.wait("pass", after=mark, result="failed", timeout=90)
    acts = [e for e in lp.find("action", after=mark) if e.at <= failed_pass.at]
    assert [(e["kind"], e["target"], e["result"]) for e in acts] == [
        ("leave", f"{omni}@{B}", "ok"),
        ("enter", f"{lane}@{A}+{B}", "failed"),
        ("enter", f"{omni}@{B}", "ok"),
    ], lp.log()
    assert "fake failure at start" in acts[1]["detail"], acts[1]["detail"]
    assert acts[2]["reason"].startswith(f"fallback: {omni} on {B} while {lane} on {A},{B} is held (next attempt in "), (
        acts[2]["reason"]
    )
    assert set(root.running()) == {root.cname(omni, B)}, "omni serves again within the one pass"
    lp.wait("fallback", after=mark, assignment=f"{omni}@{B}", timeout=5)

    # status, plan and the metrics say so while it lasts.
    # (The loop writes its state file, which status and plan read, at the end of each pass.)
    text = f"fallback: {omni} on {B} while {lane} on {A},{B} is held (next attempt in"
    wait_until(lambda: text in root.cli("status").stdout, timeout=10, what="status showing the fallback", every=0.3)
    assert f"not converged: {lane} on {A},{B} held in backoff, a fallback serves meanwhile" in root.cli("status").stdout
    plan = root.cli("plan", "--json")
    assert [f["recipe"] for f in plan.data["fallbacks"]] == [omni], plan
    assert plan.data["held"] and plan.data["actions"] == [], plan.data
    wait_until(
        lambda: lp.metric("reconciler_fallback_active", recipe=omni, slots=B, instead_of=lane) == 1,
        timeout=5,
        what="reconciler_fallback_active 1",
    )

    # Fixed: the next attempt, after the backoff, leaves omni again and enters the TP=2 lane.
    fault.unlink()
    mark = lp.mark()
    (entered,) = lp.wait("action", after=mark, kind="enter", result="ok", target=f"{lane}@{A}+{B}", timeout=60)
    acts = [e for e in lp.find("action", after=mark) if e.at <= entered.at]
    assert [(e["kind"], e["target"], e["result"]) for e in acts] == [
        ("leave", f"{omni}@{B}", "ok"),
        ("enter", f"{lane}@{A}+{B}", "ok"),
    ], lp.log()
    assert acts[0].at - failed_pass.at >= 2.5, "the next attempt waited for its backoff"
    assert set(root.running()) == {root.cname(lane, A, B)}
    lp.wait("fallback-ended", after=mark, assignment=f"{omni}@{B}", timeout=10)
    wait_until(
        lambda: lp.metric("reconciler_fallback_active", recipe=omni, slots=B, instead_of=lane) is None,
        timeout=5,
        what="the fallback series removed",
    )
    # Enters and leaves announce the time their recipe's earlier runs took.
    starts = lp.find("action-start", kind="leave", target=f"{omni}@{B}")
    assert starts and starts[-1]["earlier_runs"] >= 1 and starts[-1]["expected_s"] is not None, starts
    phases = {e["phase"] for e in lp.find("phase")}
    assert {"starting", "loading", "probes", "draining", "stopping"} <= phases or {
        "starting",
        "probes",
        "stopping",
    } <= phases, phases


def test_switch_wait_converges_the_named_topology(root: Root) -> None:
    """Two named topologies of real fake-vLLM lanes: the split (omni on b) and the TP=2 offload lane on both cards.
    `reconciler switch exclusive --wait` leaves the split's lane and enters the other (exit 0, as apply); `switch split
    --wait` brings the split back, and the offload lane's file is reclaimed by its leave."""
    omni = root.recipe("omni")
    wide = root.recipe("deepseek-256k-offload", offload_mib=24)
    root.write_manifest_text(
        f"host: {root.host}\ntopology: split   # the normal split\ntopologies:\n"
        f"  split:\n    - recipe: {omni}\n      gpus: [dark-compute-b]\n"
        f"  exclusive:\n    - recipe: {wide}\n      gpus: [dark-compute-a, dark-compute-b]\n"
    )
    assert root.apply().rc == 0
    assert list(root.running()) == [root.cname(omni, "dark-compute-b")]
    done = root.cli("switch", "exclusive", "--wait", "--json")
    assert done.rc == 0, done
    assert "topology: exclusive   # the normal split" in root.manifest_path.read_text()
    assert list(root.running()) == [root.cname(wide, "dark-compute-a", "dark-compute-b")]
    back = root.cli("switch", "split", "--wait")
    assert back.rc == 0, back
    assert list(root.running()) == [root.cname(omni, "dark-compute-b")]
    assert root.shm_files() == [], "the offload lane's leave reclaimed its file"


def _paused(port: int) -> bool:
    """The lane's own GET /is_paused (vLLM's, and the fake's with --enable-pause)."""
    status, body = http_get(f"http://127.0.0.1:{port}/is_paused")
    return status == 200 and json.loads(body).get("is_paused") is True


def test_a_leave_drains_through_pause_where_the_server_offers_it(root: Root) -> None:
    """A server with vLLM's POST /pause (the fake's --enable-pause): the leave drains through
    /pause?wait_for_inflight_requests=true, so the request in flight gets its answer and one sent meanwhile is never
    admitted (it is not answered by the lane that stops)."""
    omni = root.recipe("omni", args=["--enable-pause"], drain_timeout_s=20)
    root.manifest((omni, [B]))
    assert root.apply().rc == 0
    port = root.port_of(omni)
    first = Clients(port, f"e2e/{omni}", 1, hold_s=3)
    wait_until(lambda: (gauges(port) or (0, 0))[0] >= 1, timeout=10, what="the request in flight")
    root.manifest()
    done: list[Any] = []
    leave = threading.Thread(target=lambda: done.append(root.apply()), daemon=True)
    leave.start()
    # The leave is in its /pause once the server says so (a fixed wait raced the apply's own start on a busy machine).
    wait_until(lambda: _paused(port), timeout=30, what="the lane paused by the leave")
    late = Clients(port, f"e2e/{omni}", 1, hold_s=0)
    leave.join(60)
    (r,) = done
    assert r.rc == 0, r
    (action,) = [a for a in r.data["actions"] if a["kind"] == "leave"]
    assert action["drain"]["via"] == "pause" and action["drain"]["drained"] is True, action
    assert "drained 1 request(s) through POST /pause" in action["detail"], action["detail"]
    first.threads[0].join(10)
    assert first.answers[0][0] == 200, first.answers
    late.threads[0].join(10)
    assert late.answers.get(0, (0, ""))[0] != 200, late.answers  # never admitted: paused, then stopped
