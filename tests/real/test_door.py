"""The front door (``reconciler door``, docs/design.md, the front door) on real parts: the loop brings fake vLLM lanes
up on the real engine, the door runs as its own process, and the real ``openai`` client streams through it.

What each test proves: routing by served name and alias with streaming and ``usage`` kept, ``GET /v1/models`` in
OpenAI's shape with each name's recipe and state; a request for a lane still entering is held and answered once it
serves; the refusals (unknown model 404 naming the known ones, bad JSON 400, a body over door.max_body_mib 413, a
topology that does not run 503 with Retry-After); a client that goes away cancels its upstream request; a lane that
dies mid-stream ends the stream with an error event, and the requests sent as it died are held until it is back;
the drain of a switch waits for the door's requests in flight.
"""

from __future__ import annotations

import http.client
import itertools
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml
from e2e_helpers import LoopProcess, Root, free_port, stop_process, wait_until

openai = pytest.importorskip("openai")


class DoorProcess:
    def __init__(self, root: Root, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            root.cli_args("door", "--listen", f"127.0.0.1:{self.port}", *extra),
            env=root.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_until(lambda: self.get("/healthz")[0] == 200, timeout=20, what="the door answers")

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
        except OSError:
            return 0, None

    def post(self, path: str, data: bytes, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def client(self) -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def stop(self) -> None:
        stop_process(self.proc)
        out = self.proc.stdout.read() if self.proc.stdout else ""
        assert "Traceback" not in out, out


def _lane(root: Root, label: str, *names: str, pace: float = 200.0, **kw: Any) -> str:
    args = ["--fake-tokens-per-s", str(pace)]
    if names:
        args += ["--served-model-name", *names]
    name = root.recipe("omni", args=args, **kw)
    data = root.recipe_data(name)
    data["probes"] = []
    renamed = f"{label}-{root.tag}"
    (root.path / "configs" / "recipes" / f"{name}.toml").unlink()
    del root.recipes["omni"]
    data["model"]["id"] = data["container"]["command"][2] = f"e2e/{renamed}"
    root.write_recipe(renamed, data)
    return renamed


def _manifest(root: Root, topologies: dict[str, list[tuple[str, list[str]]]], topology: str, **extra: Any) -> None:
    doc = {
        "host": root.host,
        "topologies": {n: [{"recipe": r, "gpus": g} for r, g in lanes] for n, lanes in topologies.items()},
        "topology": topology,
        **extra,
    }
    root.write_manifest_text(yaml.safe_dump(doc, sort_keys=False))


def _stream_words(client: Any, model: str, n: int = 20) -> tuple[str, Any]:
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        max_tokens=n,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    return text, usage


def test_a_door_sent_sigterm_removes_its_published_state_and_exits_0(root: Root) -> None:
    """As systemd stops it: the drain must never wait for a door that is gone (a pid reused would make a leftover
    file count), so the state file goes with it, and the exit is a clean one."""
    a = _lane(root, "term", "term")
    _manifest(root, {"only": [(a, ["dark-compute-a"])]}, "only")
    door = DoorProcess(root)
    state = root.lock_dir / f"reconciler-{root.host}.door.json"
    wait_until(state.exists, timeout=10, what="the door publishes its state")
    door.proc.terminate()
    assert door.proc.wait(timeout=20) == 0
    out = door.proc.stdout.read() if door.proc.stdout else ""
    assert "Traceback" not in out, out
    assert not state.exists()


def test_openai_client_streams_through_the_door_by_name_and_alias(root: Root) -> None:
    a = _lane(root, "coder", "coder", "coder-long")
    _manifest(root, {"only": [(a, ["dark-compute-a"])]}, "only", aliases={"coding-agent": a})
    loop = LoopProcess(root).started(timeout=60)
    door = DoorProcess(root)
    try:
        wait_until(lambda: _state(door, "coder") == "serving", timeout=60, what="the lane serves")
        status, models = door.get("/v1/models")
        assert status == 200 and models["object"] == "list"
        by_id = {m["id"]: m for m in models["data"]}
        assert set(by_id) == {"coder", "coder-long", "coding-agent"}
        assert by_id["coding-agent"]["reconciler"] == {"recipe": a, "state": "serving", "alias": True}
        assert by_id["coder"]["object"] == "model" and by_id["coder"]["reconciler"]["recipe"] == a
        client = door.client()
        for model in ("coder", "coder-long", "coding-agent"):
            text, usage = _stream_words(client, model, 12)
            assert text.split() == ["tok"] * 12, text
            assert usage is not None and usage.completion_tokens == 12  # stream_options.include_usage kept
        # the refusals, each in OpenAI's shape
        with pytest.raises(openai.NotFoundError, match="known: coder, coder-long, coding-agent"):
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        status, _, body = door.post("/v1/chat/completions", b"{not json")
        assert status == 400 and json.loads(body)["error"]["code"] == "bad_json"
        # A relayed answer carries the door's own Date and Server, not the lane's beside them.
        ask = json.dumps({"model": "coder", "stream": True, "max_tokens": 2, "messages": []}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", door.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=ask, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        names = [k.lower() for k, _ in answer.getheaders()]
        assert answer.status == 200 and names.count("date") == 1 and names.count("server") == 1, answer.getheaders()
        answer.read()
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", door.port, timeout=10)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(17 << 20))  # over the default 16 MiB: refused before it is read
        conn.endheaders()
        answer = conn.getresponse()
        assert answer.status == 413 and "max_body_mib" in json.loads(answer.read())["error"]["message"]
        conn.close()
        metrics = urllib.request.urlopen(door.url + "/metrics", timeout=2).read().decode()
        assert 'reconciler_door_requests_total{code="200",model="coding-agent"} 1.0' in metrics
        assert "reconciler_door_upstream_first_byte_seconds_bucket" in metrics
    finally:
        door.stop()
        loop.stop()


def _state(door: DoorProcess, name: str) -> str | None:
    status, models = door.get("/v1/models")
    if status != 200:
        return None
    return next((m["reconciler"]["state"] for m in models["data"] if m["id"] == name), None)


def test_a_request_for_an_entering_lane_is_held_until_it_serves(root: Root) -> None:
    """The door starts before the lane: the request is held (not refused) and answered once the lane is healthy; a
    model of a topology that does not run is 503 with Retry-After at once."""
    a = _lane(root, "first", "first", start_timeout_s=30)
    b = _lane(root, "second", "second")
    _manifest(root, {"one": [(a, ["dark-compute-a"])], "two": [(b, ["dark-compute-b"])]}, "one")
    door = DoorProcess(root)
    loop = None
    try:
        wait_until(lambda: _state(door, "first") == "entering", timeout=20, what="the door sees the lane entering")
        got: dict[str, Any] = {}

        def ask() -> None:
            t0 = time.monotonic()
            try:
                got["text"], _ = _stream_words(door.client(), "first", 5)
            except openai.APIError as exc:
                got["error"] = f"{exc!r} after {time.monotonic() - t0:.1f} s"
            got["s"] = time.monotonic() - t0

        t = threading.Thread(target=ask)
        t.start()
        time.sleep(1.0)
        assert t.is_alive(), "the request was answered before the lane existed"
        # status shows what the door holds, read from what the door publishes (the page renders the same).
        shown = subprocess.run(root.cli_args("status", "--json"), env=root.env, capture_output=True, text=True)
        front = json.loads(shown.stdout)["door"]
        assert front["pid"] == door.proc.pid, front
        first = front["models"]["first"]
        assert first["recipe"] == a and first["state"] == "entering" and first["queue"] == 1, first
        assert first["held_s"] > 0 and first["last_request"] <= time.time()
        assert front["models"]["second"]["state"] == "not-in-topology" and front["models"]["second"]["queue"] == 0
        human = subprocess.run(root.cli_args("status"), env=root.env, capture_output=True, text=True).stdout
        assert "front door" in human and f"first -> {a}: entering" in human and "1 held" in human, human
        status, headers, body = door.post("/v1/chat/completions", b'{"model": "second", "messages": []}')
        assert status == 503 and {k.lower(): v for k, v in headers.items()}.get("retry-after"), body
        assert json.loads(body)["error"]["code"] == "not_in_topology"
        loop = LoopProcess(root).started(timeout=60)
        t.join(timeout=90)
        assert got.get("text", "").split() == ["tok"] * 5, got
        assert got["s"] > 1.0
        held = urllib.request.urlopen(door.url + "/metrics", timeout=2).read().decode()
        assert "reconciler_door_held_seconds_count 1.0" in held
    finally:
        door.stop()
        if loop is not None:
            loop.stop()


def test_a_client_gone_cancels_upstream_and_a_dead_lane_ends_the_stream(root: Root) -> None:
    a = _lane(root, "slow", "slow", pace=20.0)
    _manifest(root, {"only": [(a, ["dark-compute-a"])]}, "only")
    loop = LoopProcess(root).started(timeout=60)
    door = DoorProcess(root)
    try:
        wait_until(lambda: _state(door, "slow") == "serving", timeout=60, what="the lane serves")
        port = root.port_of(a)

        def running() -> float:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_running"))
            return float(line.rsplit(" ", 1)[1])

        # A client that goes away after the first chunks: the lane's request ends within a token or two.
        stream = door.client().chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=2000
        )
        next(iter(stream))
        assert running() == 1
        stream.close()
        wait_until(lambda: running() == 0, timeout=3, what="the upstream request cancelled")

        # A lane that dies mid-stream: the stream ends with an error event, never hangs.
        stream = door.client().chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=2000
        )
        it = iter(stream)
        next(it)
        container = f"reconciler-{a}-dark-compute-a"
        subprocess.run(["docker", "kill", container], check=True, capture_output=True, timeout=30)
        t0 = time.monotonic()
        # Requests sent the moment it died, before the door's next look: their connections are refused, and they are
        # held (not answered 502) until the loop has the lane back.
        body = json.dumps({"model": "slow", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}).encode()
        answers: list[tuple[int, bytes]] = []
        senders = [
            threading.Thread(target=lambda: answers.append(door.post("/v1/chat/completions", body, timeout=150)[::2]))
            for _ in range(3)
        ]
        for t in senders:
            t.start()
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 10
        for t in senders:
            t.join(timeout=160)
        assert [code for code, _ in answers] == [200, 200, 200], answers
    finally:
        door.stop()
        loop.stop()


def test_a_lane_replaced_in_place_is_held_at_the_door_while_it_drains(root: Root) -> None:
    """Its recipe edited while its topology keeps running: the loop drains the old lane (for the door's stream in
    flight too), stops it and enters the new one. From the drain's start the door calls it leaving and holds its new
    requests, which the new lane then answers: none is sent to the lane being drained."""
    a = _lane(root, "swap", "swap", pace=20.0, drain_timeout_s=30)
    _manifest(root, {"only": [(a, ["dark-compute-a"])]}, "only")
    loop = LoopProcess(root).started(timeout=60)
    door = DoorProcess(root)
    try:
        wait_until(lambda: _state(door, "swap") == "serving", timeout=60, what="the lane serves")
        stream = door.client().chat.completions.create(
            model="swap", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=80
        )
        it = iter(stream)
        next(it)  # a stream of about 4 s in flight through the door: the drain waits for it
        data = root.recipe_data(a)
        data["container"]["env"] = {**data["container"].get("env", {}), "SWAP_EDITION": "2"}
        root.write_recipe(a, data)
        wait_until(lambda: _state(door, "swap") == "leaving", timeout=30, what="the door calls the lane leaving")
        body = json.dumps({"model": "swap", "messages": [{"role": "user", "content": "y"}], "max_tokens": 2}).encode()
        answers: list[tuple[int, bytes]] = []
        sender = threading.Thread(target=lambda: answers.append(door.post("/v1/chat/completions", body, 150)[::2]))
        sender.start()
        for _ in it:  # the stream in flight ends whole: the drain waited for it
            pass
        sender.join(timeout=160)
        assert answers and answers[0][0] == 200, answers
        metrics = urllib.request.urlopen(door.url + "/metrics", timeout=5).read().decode()
        held = [ln for ln in metrics.splitlines() if ln.startswith("reconciler_door_held_seconds_count")]
        assert held and float(held[0].split()[-1]) >= 1, held  # held at the door, not sent to the draining lane
    finally:
        door.stop()
        loop.stop()


# ---------------------------------------------------------------- the demand policy


def _door_switches(root: Root) -> list[dict[str, Any]]:
    records = root.cli("audit", "--json").data
    records = records.get("records", records) if isinstance(records, dict) else records
    return [r for r in records if r.get("action") == "switch" and r.get("front") == "door" and r.get("outcome") == "ok"]


def test_demand_wakes_a_sleeping_topology_no_faster_than_min_dwell_and_returns_when_idle(root: Root) -> None:
    """Two standby topologies on one card: a request for the sleeping one's model switches the host to it through the
    service (audited with the door as its caller) and is answered once its lane wakes; requests alternating between
    the two switch at most once per min_dwell_s; with nothing asked of the running one for idle_return_s the host
    returns to demand.default."""
    a = root.sleeping_recipe("day")
    b = root.sleeping_recipe("night")
    dwell, idle = 4.0, 6.0
    root.write_manifest_text(
        f"host: {root.host}\n"
        "topology: one\n"
        "standby: [one, two]\n"
        "topologies:\n"
        f"  one: [{{recipe: {a}, gpus: [dark-compute-a]}}]\n"
        f"  two: [{{recipe: {b}, gpus: [dark-compute-a]}}]\n"
        f"demand: {{topologies: [one, two], default: one, idle_return_s: {idle}, min_dwell_s: {dwell}}}\n"
    )
    loop = LoopProcess(root).started(timeout=90)
    door = DoorProcess(root)
    name_a, name_b = f"e2e/{a}", f"e2e/{b}"
    try:
        wait_until(lambda: _state(door, name_a) == "serving", timeout=60, what="the day lane serves")
        wait_until(lambda: _state(door, name_b) == "asleep", timeout=60, what="the night lane sleeps")
        client = door.client()

        # The sleeping topology's model: held, switched to on demand, woken, answered.
        t0 = time.monotonic()
        text, _ = _stream_words(client, name_b, 5)
        assert text.startswith("Fake answer") and "topology: two" in root.manifest_path.read_text(), text
        (first,) = _door_switches(root)
        assert first["reason"] == "topology one -> two", first
        assert _state(door, name_a) in ("asleep", "standby") and time.monotonic() - t0 < 40

        # Alternating requests, one a second: each switch waits min_dwell_s after the one before.
        stop = time.monotonic() + 3 * dwell
        errors: list[str] = []
        models = [name_a, name_b]
        i = 0
        while time.monotonic() < stop:
            try:
                got, _ = _stream_words(client, models[i % 2], 2)
                assert got.startswith("Fake answer"), got
            except openai.APIError as exc:
                errors.append(repr(exc))
            i += 1
            time.sleep(1.0)
        assert errors == []
        switches = _door_switches(root)
        assert len(switches) >= 2
        times = [float(r["time"]) for r in switches]
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert all(g >= dwell - 0.25 for g in gaps), gaps  # never more often than min_dwell_s

        # Back to two, then nothing asked: the host returns to the default on its own.
        _stream_words(client, name_b, 1)
        assert "topology: two" in root.manifest_path.read_text()
        wait_until(
            lambda: "topology: one" in root.manifest_path.read_text(),
            timeout=idle + dwell + 10,
            what="the idle return to demand.default",
        )
        wait_until(lambda: _state(door, name_a) == "serving", timeout=60, what="the day lane serves again")
        last = _door_switches(root)[-1]
        assert last["reason"] == "topology two -> one", last
        metrics = urllib.request.urlopen(door.url + "/metrics", timeout=2).read().decode()
        assert 'reconciler_door_demand_switches_total{from="two",to="one"}' in metrics
    finally:
        door.stop()
        loop.stop()


def _door_metric(door: DoorProcess, line_start: str) -> float | None:
    text = urllib.request.urlopen(door.url + "/metrics", timeout=2).read().decode()
    return next((float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line_start)), None)


def test_a_client_gone_while_held_gives_up_its_place_and_asks_for_no_switch(root: Root) -> None:
    """A client that goes away while its request is held leaves the queue at once: it keeps no place in
    door.max_queue, and on demand it never switches the host for nobody (the switch benchmark's clients, stopped
    while held for the sleeping topology, made the door switch to it once demand: was on). No loop runs: the running
    topology's lane never serves, the other topology's model is held for a demand switch after min_dwell_s."""
    a = _lane(root, "here", "here")
    b = _lane(root, "there", "there")
    dwell = 3.0
    demand = {"topologies": ["one", "two"], "default": "one", "idle_return_s": 60, "min_dwell_s": dwell}
    _manifest(root, {"one": [(a, ["dark-compute-a"])], "two": [(b, ["dark-compute-a"])]}, "one", demand=demand)
    door = DoorProcess(root)
    depth = 'reconciler_door_queue_depth{model="there"}'
    try:
        wait_until(lambda: _state(door, "there") == "not-in-topology", timeout=20, what="the door sees the host")
        t0 = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", door.port, timeout=10)
        body = json.dumps({"model": "there", "messages": [{"role": "user", "content": "x"}], "stream": True})
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        wait_until(lambda: _door_metric(door, depth) == 1, timeout=5, what="the request held")
        conn.close()
        wait_until(lambda: _door_metric(door, depth) == 0, timeout=2, what="the gone client's place given up")
        assert _door_metric(door, 'reconciler_door_requests_total{code="499",model="there"}') == 1
        time.sleep(max(0.0, t0 + dwell + 1.5 - time.monotonic()))  # past min_dwell_s: a held request would switch
        assert "topology: one" in root.manifest_path.read_text()
        assert _door_switches(root) == []
    finally:
        door.stop()
