"""Sleeping lanes on the real engine (docs/design.md, sleeping lanes): fake vLLM lanes with sleep mode
(examples/fake-vllm: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1), the split and the exclusive TP=2 lane both on
standby, switched by ``reconciler switch NAME --wait`` as a whole process: the lanes are put to sleep and woken, never
entered again (their containers keep their ids), a request in flight is answered before its lane sleeps (rule 5), a
sleeping lane answers no request (rule 3), and a wake that fails is a failed enter, entered cold after it (rule 6).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import SLEEP, LoopProcess, Root, wait_until

A, B = "dark-compute-a", "dark-compute-b"

pytestmark = pytest.mark.usefixtures("docker_api")


def standby_manifest(root: Root, a: str, b: str, big: str, running: str = "split") -> None:
    root.write_manifest_text(
        f"host: {root.host}\n"
        f"topology: {running}\n"
        "standby: [split, exclusive]\n"
        "topologies:\n"
        "  split:\n"
        f"    - {{recipe: {a}, gpus: [{A}]}}\n"
        f"    - {{recipe: {b}, gpus: [{B}]}}\n"
        "  exclusive:\n"
        f"    - {{recipe: {big}, gpus: [{A}, {B}]}}\n"
    )


def ask(port: int, model: str, **extra: Any) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "Reply with the single word: ready"}], **extra}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def kinds(r: Any) -> list[tuple[str, str, str]]:
    return [(a["kind"], a["recipe"], a["result"]) for a in r.data["actions"]]


def sleeping(root: Root) -> dict[str, bool | None]:
    return {c["recipe"]: c["sleeping"] for c in root.status()["containers"] if c["state"] == "running"}


def test_a_switch_between_standby_topologies_sleeps_and_wakes_the_same_containers(root: Root) -> None:
    a, b = root.sleeping_recipe("small-a"), root.sleeping_recipe("small-b")
    big = root.sleeping_recipe("big", tp=2, level=2)
    standby_manifest(root, a, b, big)

    first = root.apply()
    assert first.rc == 0, first
    # The standby lane first (its cards hold no awake lane yet), put to sleep once healthy; then the split.
    assert kinds(first) == [
        ("enter", big, "ok"),
        ("sleep", big, "ok"),
        ("enter", a, "ok"),
        ("enter", b, "ok"),
    ], kinds(first)
    assert sleeping(root) == {a: False, b: False, big: True}
    # Each enter says the lane's vLLM release (its GET /version), in its outcome and its audit record.
    assert {x["vllm_version"] for x in first.data["actions"] if x["kind"] == "enter"} == {"0.0.0+fake"}, first.data
    audit = root.cli("audit", "--json")
    entered = [x for r in audit.data["records"] for x in r.get("actions") or () if x.get("kind") == "enter"]
    assert entered and all(r.get("vllm_version") == "0.0.0+fake" for r in entered), entered
    ids = {c["recipe"]: c["id"] for c in root.status()["containers"]}
    big_port, a_port = root.port_of(big), root.port_of(a)
    assert ask(big_port, f"e2e/{big}")[0] == 503  # asleep: it answers no request (rule 3)
    assert ask(a_port, f"e2e/{a}")[0] == 200

    there = root.cli("switch", "exclusive", "--wait", "--json")
    assert there.rc == 0, there
    assert sorted(kinds(there)) == sorted([("sleep", a, "ok"), ("sleep", b, "ok"), ("wake", big, "ok")]), kinds(there)
    wake = next(x for x in there.data["actions"] if x["kind"] == "wake")
    assert "reloaded" in json.dumps(wake) or "awake (level 2)" in wake["detail"], wake
    assert set(wake["dark_s"]) == {A, B}, wake
    assert sleeping(root) == {a: True, b: True, big: False}
    assert {c["recipe"]: c["id"] for c in root.status()["containers"]} == ids  # nothing entered again
    assert ask(big_port, f"e2e/{big}")[0] == 200 and ask(a_port, f"e2e/{a}")[0] == 503

    # Back, with a request held in flight on the exclusive lane: it is answered before the lane sleeps (rule 5).
    answers: list[tuple[int, str]] = []
    held = threading.Thread(target=lambda: answers.append(ask(big_port, f"e2e/{big}", fake_hold_s=3)), daemon=True)
    held.start()
    back = root.cli("switch", "split", "--wait", "--json")
    held.join(30)
    assert back.rc == 0, back
    assert sorted(kinds(back)) == sorted([("sleep", big, "ok"), ("wake", a, "ok"), ("wake", b, "ok")]), kinds(back)
    assert answers and answers[0][0] == 200, answers
    sleep = next(x for x in back.data["actions"] if x["kind"] == "sleep")
    assert sleep["drain"]["drained"] is True and sleep["drain"]["requests_at_start"] >= 1, sleep
    assert sleeping(root) == {a: False, b: False, big: True}
    assert {c["recipe"]: c["id"] for c in root.status()["containers"]} == ids
    plan = root.cli("plan", "--json")
    assert plan.rc == 0 and plan.data["actions"] == [], plan

    # Off standby: the sleeping exclusive lane leaves from beside the awake split (their cards stay theirs).
    root.write_manifest_text(root.manifest_path.read_text().replace("standby: [split, exclusive]\n", ""))
    off = root.apply()
    assert off.rc == 0 and kinds(off) == [("leave", big, "ok")], off
    assert sleeping(root) == {a: False, b: False}


def test_a_wake_that_fails_is_a_failed_enter_and_the_lane_is_entered_cold(root: Root) -> None:
    a, b = root.sleeping_recipe("small-a"), root.sleeping_recipe("small-b")
    big = root.sleeping_recipe("big", tp=2)
    standby_manifest(root, a, b, big)
    assert root.apply().rc == 0
    # The sleeping lane's engine now fails every wake.
    req = urllib.request.Request(
        f"http://127.0.0.1:{root.port_of(big)}/fake/mode", data=json.dumps({"mode": "wake-fail"}).encode()
    )
    urllib.request.urlopen(req, timeout=5).close()
    failed = root.cli("switch", "exclusive", "--wait", "--json")
    assert failed.rc == 1, failed
    wake = next(x for x in failed.data["actions"] if x["kind"] == "wake")
    assert wake["result"] == "failed" and "wake " in wake["detail"] and "Kept as reconciler-" in wake["detail"], wake
    assert "fake wake failure" in wake["detail"], wake
    kept = [c for c in root.containers() if "-failed-" in c["Names"][0]]
    assert len(kept) == 1 and kept[0]["State"] == "exited", kept
    # The next apply enters it cold (a fresh container, whose engine wakes as it should).
    again = root.apply()
    assert again.rc == 0, again
    assert ("enter", big, "ok") in kinds(again), kinds(again)
    assert sleeping(root)[big] is False

    # Their recipes deleted and the manifest emptied: every lane leaves, the awake one from beside the sleeping ones
    # (whose recipes, and so whose sleep mode, the files no longer tell).
    root.manifest()
    for name in (a, b, big):
        (root.path / "configs" / "recipes" / f"{name}.toml").unlink()
    gone = root.apply()
    leaves = sorted(k for k in kinds(gone) if k[0] == "leave")
    assert gone.rc == 0 and leaves == sorted(("leave", r, "ok") for r in (a, b, big)), kinds(gone)
    assert root.running() == {}


def test_the_api_and_mcp_switch_as_the_command_does_and_the_loop_converges_it(root: Root, tmp_path: Path) -> None:
    import asyncio

    from real.test_api import TOKEN, Api, token_file
    from real.test_mcp import on_http, structured

    a, b = root.sleeping_recipe("small-a"), root.sleeping_recipe("small-b")
    big = root.sleeping_recipe("big", tp=2)
    standby_manifest(root, a, b, big)
    lp = LoopProcess(root, "--api-token-file", str(token_file(tmp_path)))
    try:
        lp.wait("pass", result="converged", timeout=90)
        api = Api(f"http://{lp.addr}", TOKEN)
        assert sleeping(root) == {a: False, b: False, big: True}

        # An unknown topology: refused, the file unchanged.
        before = root.manifest_path.read_bytes()
        status, _, body = api.post("/v1/switch", {"topology": "nowhere"})
        assert status == 409 and "nowhere" in body["error"], body
        status, _, body = api.post("/v1/switch", {"topology": "x", "wait": True})
        assert status == 400, body
        assert root.manifest_path.read_bytes() == before

        status, _, body = api.post("/v1/switch", {"topology": "exclusive"})
        assert status == 200 and body["topology"] == "exclusive" and body["from"] == "split", body
        wait_until(lambda: sleeping(root) == {a: True, b: True, big: False}, timeout=60, what="the loop's wake")

        async def back(session: Any) -> dict[str, Any]:
            res = await session.call_tool("host_manage", {"action": "switch", "topology": "split"})
            return structured(res)

        done = asyncio.run(on_http(f"http://{lp.addr}/mcp", TOKEN, back))
        assert done["topology"] == "split" and done["changed"] is True, done
        wait_until(lambda: sleeping(root) == {a: False, b: False, big: True}, timeout=60, what="the loop's switch back")

        def metrics() -> str:
            return urllib.request.urlopen(f"http://{lp.addr}/metrics", timeout=10).read().decode()

        # The loop exports what its pass saw once the pass ends: a moment after the host got there.
        wanted = (
            f'reconciler_lane_sleeping{{recipe="{big}",slots="{A},{B}"}} 1.0',
            f'reconciler_lane_sleeping{{recipe="{a}",slots="{A}"}} 0.0',
        )

        def exported() -> str | None:
            m = metrics()
            return m if all(w in m for w in wanted) else None

        text = wait_until(exported, timeout=30, what="the sleeping lanes in the loop's metrics")
        wakes = [ln for ln in text.splitlines() if ln.startswith('reconciler_switch_seconds_count{how="wake"}')]
        assert wakes and float(wakes[0].split()[-1]) >= 3, wakes
        fronts = {r.get("front") for r in api.get("/v1/audit")[2]["records"] if r.get("action") == "switch"}
        assert {"api", "mcp"} <= fronts, fronts
    finally:
        lp.stop()


def test_a_lane_whose_drain_times_out_is_never_put_to_sleep_but_left(root: Root) -> None:
    """Rule 5: POST /sleep is never sent with a request in flight. Rule 6: a lane that will not sleep is left."""
    a, b = root.sleeping_recipe("small-a"), root.sleeping_recipe("small-b")
    big = root.sleeping_recipe("big", tp=2)
    data = root.recipe_data(a)
    data["drain"] = {"timeout_s": 0.5}
    root.write_recipe(a, data)
    standby_manifest(root, a, b, big)
    assert root.apply().rc == 0
    port = root.port_of(a)
    answers: list[tuple[int, str]] = []
    held = threading.Thread(target=lambda: answers.append(ask(port, f"e2e/{a}", fake_hold_s=15)), daemon=True)
    held.start()
    seen: list[bool] = []
    stop = threading.Event()

    def watch() -> None:
        from reconciler.observe.lane_sleep import ask_sleeping

        while not stop.is_set():
            said = ask_sleeping(f"http://127.0.0.1:{port}", timeout=1)
            if isinstance(said, bool):
                seen.append(said)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.3)
    r = root.cli("switch", "exclusive", "--wait", "--json")
    stop.set()
    watcher.join(5)
    assert r.rc == 1, r
    sleep = next(x for x in r.data["actions"] if x["kind"] == "sleep" and x["recipe"] == a)
    assert sleep["result"] == "failed" and "would not sleep" in sleep["detail"], sleep
    assert "drain timed out" in sleep["detail"] and "left (stopped) instead" in sleep["detail"], sleep
    assert seen and True not in seen, "the lane was put to sleep with a request in flight"
    assert root.cname(a, A) not in root.running()


def test_a_switch_whose_wake_is_blocked_darkens_no_serving_lane(root: Root) -> None:
    """Sleeping lanes rule 8 on the real engine: the split serves, the exclusive lane sleeps, and a container this
    tool did not start holds card A. `switch exclusive` would put both split lanes to sleep for a wake that cannot
    run: instead both keep serving (answering requests), the plan says so and exits 3, and once the foreign container
    is gone the switch runs."""
    a, b = root.sleeping_recipe("small-a"), root.sleeping_recipe("small-b")
    big = root.sleeping_recipe("big", tp=2, level=2)
    standby_manifest(root, a, b, big)
    assert root.apply().rc == 0
    assert sleeping(root) == {a: False, b: False, big: True}
    foreign = root.run_unmanaged("jupyter", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}", *SLEEP)
    switched = root.cli("switch", "exclusive", "--json")
    assert switched.rc == 0, switched
    r = root.apply()
    assert r.rc == 3, r
    assert kinds(r) == [], kinds(r)
    assert sleeping(root) == {a: False, b: False, big: True}
    assert ask(root.port_of(a), f"e2e/{a}")[0] == 200 and ask(root.port_of(b), f"e2e/{b}")[0] == 200
    plan = root.cli("plan")
    assert plan.rc == 3, plan
    assert foreign in plan.stdout, plan.stdout
    for lane in (root.cname(a, A), root.cname(b, B)):
        assert f"{lane} keeps serving: what would replace it is blocked" in plan.stdout, plan.stdout
    root.api.remove_container(foreign, force=True)
    done = root.apply()
    assert done.rc == 0, done
    assert sorted(kinds(done)) == sorted([("sleep", a, "ok"), ("sleep", b, "ok"), ("wake", big, "ok")]), kinds(done)
