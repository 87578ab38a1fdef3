#!/usr/bin/env python3
"""Benchmark: the front door (``reconciler door``) through switches and on demand, whole processes on the real
engine (issue 42, parts b and c; part a, what the door costs a stream, is ``bench_door.py``).

Two lanes of the fake vLLM (examples/fake-vllm/) with sleep mode, each its own standby topology on one card (``one``:
the day lane, ``two``: the night lane), each waking in ``--wake-s`` (1 s), streaming at ``--pace`` tokens per second
and serving two names (``--served-model-name e2e/LANE LANE``); the manifest's alias ``assistant`` names the night
lane. ``reconciler run`` keeps the host converged and ``reconciler door`` fronts it, each a process of its own.

(b) Switches under load. ``--clients`` (32) clients in a process of their own stream chat completions without pause
through the door, a quarter to each of the four names (two per topology), while the host switches ``--switches``
(10) times between the two topologies (``reconciler switch NAME``, the loop converging it), each topology streaming
``--stay-s`` after its return. Counted: failed requests (not 200, or the connection lost), cut streams (no
``[DONE]``, an error event, or fewer tokens than asked) and, for each request, how long it was held beyond its
topology's return: its first byte less the later of when it was sent and when its topology's lane was next awake
with its topology in the manifest (each lane's ``GET /is_sleeping`` asked every 50 ms, the manifest's mtime at each
switch), over every request and split into those sent while their topology slept or was leaving (held for its
return) and those sent while it served (their time to first byte: a tail there is the relay's, not a hold). Goal:
0 failed, 0 cut, none more than 0.5 s beyond its return.

(c) On demand. The same manifest with ``demand: {topologies: [one, two], default: one}`` and ``--dwell``/``--idle``
as its ``min_dwell_s``/``idle_return_s``:
- a request for the sleeping night lane's model switches the host, wakes the lane and gets its first byte; goal:
  within the wake action's own time (the wake and its probes, as the loop's log reports it) plus 0.5 s;
- a request every second alternating between the two topologies' models for ``--alternate-s``: the door's switches
  (its audit records) at most once per ``min_dwell_s``; every request answered in full;
- then one request for the night lane and nothing more: the door's switch back to ``default`` (its audit record)
  comes within one pass of the door's look (``LOOK_S`` plus the look itself, the longest measured from the door's
  published looks) after ``idle_return_s`` from that request.

Every figure is printed beside its goal, met or not. Exit status 1 when a request failed or a stream was cut.
Run as root with a Docker engine: ``python3 tests/bench/bench_door_switch.py``. Everything it made (the lanes'
containers, the processes, the tmpfs) is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

A = "dark-compute-a"
GOAL_HELD_S = 0.5  # beyond its topology's return (b)
GOAL_FIRST_BYTE_S = 0.5  # beyond the wake action (c)


# ---------------------------------------------------------------- the load (its own process)


async def _one(client: Any, url: str, model: str, n_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": n_tokens}
    rec: dict[str, Any] = {"model": model, "sent": time.monotonic(), "first": None, "end": None, "status": None}
    rec.update(done=False, error="", tokens=0)
    try:
        async with client.stream("POST", url, json=body) as resp:
            rec["status"] = resp.status_code
            buf = b""
            async for chunk in resp.aiter_raw():
                if rec["first"] is None:
                    rec["first"] = time.monotonic()
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    _event(rec, ev.removeprefix(b"data: ").strip())
    except asyncio.CancelledError:
        rec["error"] = "cancelled at the end of the run"
        rec["cancelled"] = True
    except Exception as exc:  # noqa: BLE001 - any failure of one request is counted, never fatal to the load
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["end"] = time.monotonic()
    return rec


def _event(rec: dict[str, Any], data: bytes) -> None:
    if data == b"[DONE]":
        rec["done"] = True
    elif data:
        try:
            doc = json.loads(data)
        except ValueError:
            rec["error"] = rec["error"] or f"not JSON: {data[:120]!r}"
            return
        if "error" in doc:
            rec["error"] = str(doc["error"])[:300]
        choices = doc.get("choices") or []
        if choices and (choices[0].get("delta") or {}).get("content"):
            rec["tokens"] += 1


async def _load(url: str, models: list[str], clients: int, n_tokens: int, stop: Path, grace: float) -> list[Any]:
    import httpx

    out: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10), limits=limits, trust_env=False) as client:

        async def worker(i: int) -> None:
            while not stop.exists():
                out.append(await _one(client, url, models[i % len(models)], n_tokens))

        tasks = [asyncio.create_task(worker(i)) for i in range(clients)]
        while not stop.exists():
            await asyncio.sleep(0.05)
        # Streams under way finish; a request still held for the topology that sleeps at the end is cancelled.
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return out


# ---------------------------------------------------------------- what the bench watches


@dataclass
class Watcher:
    """Every 50 ms: each lane's own word on whether it sleeps (``GET /is_sleeping``), and the door's published looks
    (the ``at`` of its state file: one per look)."""

    lanes: dict[str, str]  # recipe -> origin
    door_state: Path
    samples: list[tuple[float, str, bool | None]] = field(default_factory=list)
    looks: list[float] = field(default_factory=list)  # epoch seconds of each look the door published
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Watcher:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            for recipe, origin in self.lanes.items():
                self.samples.append((time.monotonic(), recipe, _awake(origin)))
            try:
                at = float(json.loads(self.door_state.read_text())["at"])
                if not self.looks or at != self.looks[-1]:
                    self.looks.append(at)
            except (OSError, ValueError, KeyError, TypeError):
                pass
            time.sleep(0.05)

    def awake_after(self, recipe: str, t: float) -> float | None:
        return next((at for at, r, awake in list(self.samples) if r == recipe and at >= t and awake), None)

    def asleep_now(self, recipe: str) -> bool:
        last = next((awake for _, r, awake in reversed(list(self.samples)) if r == recipe), None)
        return last is False

    def look_gaps(self, since_wall: float) -> list[float]:
        xs = [x for x in self.looks if x >= since_wall]
        return [b - a for a, b in itertools.pairwise(xs)]


def _awake(origin: str) -> bool | None:
    try:
        with urllib.request.urlopen(origin + "/is_sleeping", timeout=1) as r:
            return not json.loads(r.read())["is_sleeping"]
    except (OSError, ValueError, KeyError):
        return None


def _wait(what: str, ok: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit(f"{what}: not within {timeout:g} s")


def _states(door_url: str) -> dict[str, str]:
    try:
        with urllib.request.urlopen(door_url + "/v1/models", timeout=2) as r:
            return {m["id"]: m["reconciler"]["state"] for m in json.loads(r.read())["data"]}
    except (OSError, ValueError, KeyError):
        return {}


def _stream(door_url: str, model: str, n_tokens: int) -> dict[str, Any]:
    """One streamed request through the door, in this process (phase c's requests are one at a time)."""
    import httpx

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10), trust_env=False) as client:
            rec = await _one(client, door_url + "/v1/chat/completions", model, n_tokens)
        rec["wall_sent"] = time.time() - (time.monotonic() - rec["sent"])
        return rec

    return asyncio.run(go())


def _bad(rec: dict[str, Any], n_tokens: int) -> str:
    """'failed', 'cut' or '' (answered in full)."""
    if rec["status"] != 200 or rec["first"] is None:
        return "failed"
    if not rec["done"] or rec["error"] or rec["tokens"] < n_tokens:
        return "cut"
    return ""


# ---------------------------------------------------------------- the set-up


@dataclass
class Bench:
    root: Any
    args: argparse.Namespace
    base: Path
    day: str = ""
    night: str = ""
    loop: Any = None
    door: subprocess.Popen[bytes] | None = None
    door_url: str = ""
    watcher: Watcher | None = None
    offset: float = field(default_factory=lambda: time.time() - time.monotonic())  # wall = monotonic + offset

    def lane(self, label: str) -> str:
        a = self.args
        name = self.root.sleeping_recipe(label, mode=f"wake-delay={a.wake_s:g}", start_timeout_s=60)
        data = self.root.recipe_data(name)
        data["container"]["command"] += ["--fake-tokens-per-s", str(a.pace), "--served-model-name", f"e2e/{name}"]
        data["container"]["command"] += [label]
        # The probes that a paced lane passes (its answers are "tok tok ...", so no probe of the text).
        data["probes"] = [p for p in data["probes"] if p["name"] in ("models", "streaming")][: a.probes]
        self.root.write_recipe(name, data)
        return name

    def manifest(self, topology: str, *, demand: bool) -> None:
        a = self.args
        text = (
            f"host: {self.root.host}\ntopology: {topology}\nstandby: [one, two]\ntopologies:\n"
            f"  one: [{{recipe: {self.day}, gpus: [{A}]}}]\n  two: [{{recipe: {self.night}, gpus: [{A}]}}]\n"
            f"aliases: {{assistant: {self.night}}}\n"
        )
        if demand:
            text += (
                f"demand: {{topologies: [one, two], default: one, idle_return_s: {a.idle:g}, "
                f"min_dwell_s: {a.dwell:g}}}\n"
            )
        self.root.write_manifest_text(text)

    def topology(self) -> str:
        m = re.search(r"^topology: (\S+)", self.root.manifest_path.read_text(), re.M)
        return m.group(1) if m else ""

    def written_at(self) -> float:
        """When the manifest was last written, on the monotonic clock."""
        return self.root.manifest_path.stat().st_mtime - self.offset

    def start(self) -> None:
        from e2e_helpers import LoopProcess, free_port

        self.day, self.night = self.lane("day"), self.lane("night")
        self.manifest("one", demand=False)
        self.loop = LoopProcess(self.root).started(timeout=120)
        port = free_port()
        self.door_url = f"http://127.0.0.1:{port}"
        self.door = subprocess.Popen(
            self.root.cli_args("door", "--listen", f"127.0.0.1:{port}"),
            env=self.root.env,
            stdout=subprocess.DEVNULL,
            stderr=(self.base / "door.log").open("wb"),
        )
        want = {f"e2e/{self.day}": "serving", f"e2e/{self.night}": "asleep"}
        try:
            _wait(
                "the day lane serves, the night lane sleeps",
                lambda: want.items() <= _states(self.door_url).items(),
                120,
            )
        except SystemExit:
            print(f"the door sees {_states(self.door_url)}\n{(self.base / 'door.log').read_text()[-2000:]}")
            print(self.loop.log()[-4000:])
            raise
        lanes = {r: f"http://127.0.0.1:{self.root.port_of(r)}" for r in (self.day, self.night)}
        state = Path(self.root.env["RECONCILER_LOCK_DIR"]) / f"reconciler-{self.root.host}.door.json"
        self.watcher = Watcher(lanes, state).start()

    def stop(self) -> None:
        from e2e_helpers import stop_process

        if self.watcher is not None:
            self.watcher.stop.set()
        if self.door is not None:
            stop_process(self.door)
        if self.loop is not None:
            self.loop.stop()

    def door_switches(self) -> list[dict[str, Any]]:
        records = self.root.cli("audit", "--json").data
        records = records.get("records", records) if isinstance(records, dict) else records
        ok = [r for r in records if r.get("action") == "switch" and r.get("outcome") == "ok"]
        return [r for r in ok if r.get("front") == "door"]


# ---------------------------------------------------------------- (b) switches under load


def switches_under_load(b: Bench) -> dict[str, Any]:
    a, w = b.args, b.watcher
    assert w is not None
    models = [f"e2e/{b.day}", "night", "day", "assistant"]
    topology_of = {f"e2e/{b.day}": "one", "day": "one", "night": "two", "assistant": "two"}
    lane_of = {"one": b.day, "two": b.night}
    stop, results = b.base / "stop-load", b.base / "load.json"
    load = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--clients",
            str(a.clients),
            "--tokens",
            str(a.tokens),
            "--client",
            b.door_url + "/v1/chat/completions",
            ",".join(models),
            str(stop),
            str(results),
        ],
        env=os.environ,
    )
    t0 = time.monotonic()
    periods: dict[str, list[list[float]]] = {"one": [[t0, float("inf")]], "two": []}
    switch_s: list[float] = []
    time.sleep(a.stay_s)
    for k in range(a.switches):
        to, away = ("two", "one") if k % 2 == 0 else ("one", "two")
        done = b.root.cli("switch", to)
        if done.rc != 0:
            raise SystemExit(f"reconciler switch {to} failed:\n{done}")
        written = b.written_at()
        periods[away][-1][1] = written
        back = _wait(f"the switch to {to}", lambda: w.awake_after(lane_of[to], written), 60)  # noqa: B023
        _wait(f"the {away} lane sleeps", lambda: w.asleep_now(lane_of[away]), 60)  # noqa: B023
        periods[to].append([back, float("inf")])
        switch_s.append(back - written)
        time.sleep(a.stay_s)
    end = time.monotonic()
    looks = w.look_gaps(t0 + b.offset)
    stop.touch()
    if load.wait(timeout=120) != 0:
        raise SystemExit("the load process failed")
    recs = json.loads(results.read_text())
    return {
        "recs": recs,
        "periods": periods,
        "topology_of": topology_of,
        "switch_s": switch_s,
        "seconds": end - t0,
        "look_gaps": looks,
    }


def held_beyond(rec: dict[str, Any], periods: list[list[float]]) -> tuple[bool, float | None, float | None]:
    """(whether it was held for its topology's return, its first byte less the later of its sending and that
    return, when its topology last came back or next comes back); None when that did not happen within the run."""
    sent = rec["sent"]
    start = next((s for s, e in periods if s <= sent < e), None)
    if start is not None:
        back, held = sent, False
    else:
        start = back = next((s for s, _ in periods if s > sent), None)
        held = True
    if back is None or rec["first"] is None:
        return held, None, start
    return held, rec["first"] - back, start


# ---------------------------------------------------------------- (c) on demand


def on_demand(b: Bench) -> dict[str, Any]:
    a, w = b.args, b.watcher
    assert w is not None
    out: dict[str, Any] = {"requests": []}
    b.manifest(b.topology(), demand=True)
    time.sleep(a.dwell + 1.0)  # the door reads demand: on its next look; the running topology has served min_dwell_s
    if b.topology() != "one":
        raise SystemExit(f"phase c starts on topology {b.topology()}, not one")
    _wait("the night lane sleeps", lambda: w.asleep_now(b.night), 30)

    # 1. a request for the sleeping lane's model: switched, woken, answered.
    mark = b.loop.mark()
    first = _stream(b.door_url, "night", 8)
    out["requests"].append(first)
    wake = b.loop.wait("action", kind="wake", timeout=30, after=mark)[0]
    m = re.search(r"awake \(level \d\) in ([0-9.]+) s", wake["detail"])
    out["wake_action_s"], out["woke_s"] = float(wake["seconds"]), float(m.group(1)) if m else None
    out["first_byte_s"] = (first["first"] or float("inf")) - first["sent"]

    # 2. a request a second, alternating between the two topologies' models.
    recs: list[dict[str, Any]] = []
    threads = []
    t0, out["alternate_from"] = time.monotonic(), time.time()
    for i in range(int(a.alternate_s)):
        model = ("day", "night")[i % 2]
        th = threading.Thread(target=lambda m=model: recs.append(_stream(b.door_url, m, 8)), daemon=True)
        th.start()
        threads.append(th)
        time.sleep(max(0.0, t0 + i + 1 - time.monotonic()))
    for th in threads:
        th.join(timeout=a.dwell * 3 + 60)
    out["requests"] += recs
    out["alternate_s"], out["alternate_to"] = time.monotonic() - t0, time.time()

    # 3. on the night topology, one last request and nothing more: the idle return to the default.
    if b.topology() != "two":
        out["requests"].append(_stream(b.door_url, "night", 4))
    last = _stream(b.door_url, "night", 4)
    out["requests"].append(last)
    since = time.time()
    _wait(
        "the idle return to one",
        lambda: b.topology() == "one",
        a.idle + a.dwell + 20,
    )
    switches = b.door_switches()
    out["switches"] = switches
    back = [r for r in switches if float(r["time"]) >= since]
    out["idle_return_s"] = float(back[0]["time"]) - last["wall_sent"] if back else None
    out["look_gaps"] = w.look_gaps(since)
    return out


# ---------------------------------------------------------------- the report


def row(what: str, figure: str, goal: str, met: bool | None) -> None:
    mark = "-" if met is None else ("met" if met else "MISSED")
    print(f"| {what} | {figure} | {goal} | {mark} |")


def report_b(b: Bench, res: dict[str, Any]) -> bool:
    a = b.args
    recs = [r for r in res["recs"] if not r.get("cancelled")]
    left = len(res["recs"]) - len(recs)
    kinds = [_bad(r, a.tokens) for r in recs]
    failed, cut = kinds.count("failed"), kinds.count("cut")
    excess: list[float] = []
    held_excess: list[float] = []  # sent while its topology slept or was leaving: first byte beyond its return
    serving_ttfb: list[float] = []  # sent while its topology served: its time to first byte
    worst: list[tuple[float, float, dict[str, Any]]] = []
    held = 0
    for r in recs:
        was_held, beyond, start = held_beyond(r, res["periods"][res["topology_of"][r["model"]]])
        held += was_held
        if beyond is not None and start is not None:
            excess.append(max(0.0, beyond))
            (held_excess if was_held else serving_ttfb).append(max(0.0, beyond))
            worst.append((beyond, start, r))
    over = sum(1 for x in excess if x > GOAL_HELD_S)
    sw = res["switch_s"]
    print(
        f"\n(b) {a.clients} clients streaming {a.tokens} tokens at {a.pace:g} tokens/s through the door to 4 names "
        f"of 2 standby topologies, {a.switches} switches (wake {a.wake_s:g} s, each topology streaming {a.stay_s:g} s "
        f"after its return), {res['seconds']:.0f} s"
    )
    print("\n| figure | measured | goal | |\n| --- | ---: | --- | --- |")
    row("requests answered in full", f"{len(recs) - failed - cut:,} of {len(recs):,}", "all", failed + cut == 0)
    row("failed requests", str(failed), "0", failed == 0)
    row("cut streams", str(cut), "0", cut == 0)
    row("requests held for their topology's return", f"{held:,}", "", None)
    for what, xs in (
        ("every request: first byte beyond max(sent, its topology's return)", excess),
        ("- held for a return: first byte beyond the return", held_excess),
        ("- sent while its topology served: time to first byte", serving_ttfb),
    ):
        if xs:
            p99 = statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) > 1 else xs[0]
            met = max(xs) <= GOAL_HELD_S
            row(f"{what}, p99 / max", f"{p99:.2f} / {max(xs):.2f} s", f"<= {GOAL_HELD_S:g} s", met)
    row("requests that waited more than 0.5 s beyond it", str(over), "0", over == 0)
    row(
        "a switch: manifest written -> its lane awake, median / max",
        f"{statistics.median(sw):.2f} / {max(sw):.2f} s",
        "",
        None,
    )
    gaps = res["look_gaps"]
    if gaps:
        row(
            "the door's looks at the host: gap median / max",
            f"{statistics.median(gaps):.2f} / {max(gaps):.2f} s",
            "",
            None,
        )
    print("\nthe longest held beyond their return:" if worst else "")
    for beyond, start, r in sorted(worst, key=lambda x: -x[0])[:3]:
        look = next((x - b.offset for x in b.watcher.looks if x - b.offset >= start), None) if b.watcher else None
        print(
            f"  {beyond:.2f} s: {r['model']} sent {r['sent'] - start:+.2f} s from its lane's return (awake), first byte "
            f"{r['first'] - r['sent']:.2f} s after sending; the door's first look after the return began "
            + (f"{look - start:.2f} s after it" if look is not None else "-")
        )
    if left:
        print(f"{left} request(s) still held for the sleeping topology when the load stopped (cancelled, not counted)")
    for r, k in zip(recs, kinds, strict=True):
        if k:
            print(f"  {k}: {r['model']} status {r['status']} tokens {r['tokens']} done {r['done']} {r['error'][:200]}")
    return failed + cut == 0


def report_c(b: Bench, res: dict[str, Any]) -> bool:
    a = b.args
    kinds = [_bad(r, 0) for r in res["requests"]]
    failed = len([k for k in kinds if k])
    budget = res["wake_action_s"] + GOAL_FIRST_BYTE_S
    times = sorted(float(r["time"]) for r in res["switches"])
    gaps = [y - x for x, y in itertools.pairwise(times)]
    alternating = [t for t in times if res["alternate_from"] <= t < res["alternate_to"]]
    allowed = int(res["alternate_s"] // a.dwell) + 1
    print(
        f"\n(c) demand: {{topologies: [one, two], default: one, min_dwell_s: {a.dwell:g}, idle_return_s: {a.idle:g}}}"
        f", wake {a.wake_s:g} s, {a.probes} probe(s)"
    )
    print("\n| figure | measured | goal | |\n| --- | ---: | --- | --- |")
    row(
        "a sleeping model asked: first byte",
        f"{res['first_byte_s']:.2f} s",
        f"<= wake + probes {res['wake_action_s']:.2f} s (woke in {res['woke_s']}) + 0.5 = {budget:.2f} s",
        res["first_byte_s"] <= budget,
    )
    row(
        f"alternating each second for {res['alternate_s']:.0f} s: door switches",
        str(len(alternating)),
        f"<= {allowed} (one per min_dwell_s)",
        len(alternating) <= allowed,
    )
    if gaps:
        row(
            "shortest gap between two door switches",
            f"{min(gaps):.2f} s",
            f">= min_dwell_s {a.dwell:g} s",
            min(gaps) >= a.dwell - 0.05,
        )
    gaps_look = res["look_gaps"]
    one_pass = max(gaps_look) if gaps_look else 0.2
    ret = res["idle_return_s"]
    row(
        "idle return: the door's switch to default after the last request",
        "none" if ret is None else f"{ret:.2f} s",
        f"idle_return_s {a.idle:g} s + one look of the door (longest {one_pass:.2f} s, median "
        f"{statistics.median(gaps_look) if gaps_look else 0:.2f} s)",
        ret is not None and a.idle <= ret <= a.idle + one_pass,
    )
    row("requests answered in full", f"{len(kinds) - failed} of {len(kinds)}", "all", failed == 0)
    for r, k in zip(res["requests"], kinds, strict=True):
        if k:
            print(f"  {k}: {r['model']} status {r['status']} done {r['done']} {r['error'][:200]}")
    return failed == 0


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--switches", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=32, help="tokens of each streamed answer in (b)")
    ap.add_argument("--pace", type=float, default=50.0, help="tokens per second of one stream")
    ap.add_argument("--wake-s", type=float, default=1.0)
    ap.add_argument("--stay-s", type=float, default=2.0, help="seconds each topology streams after its return")
    ap.add_argument(
        "--probes",
        type=int,
        default=2,
        help="preflight probes run after each wake: the demo's models and streaming ones (0 to 2)",
    )
    ap.add_argument("--dwell", type=float, default=4.0, help="demand.min_dwell_s")
    ap.add_argument("--idle", type=float, default=5.0, help="demand.idle_return_s")
    ap.add_argument("--alternate-s", type=float, default=12.0)
    ap.add_argument("--only", choices=["b", "c"], help="one part only")
    ap.add_argument("--client", nargs=4, metavar=("URL", "MODELS", "STOP", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        url, models, stop, out = args.client
        grace = args.tokens / args.pace + 1
        recs = asyncio.run(_load(url, models.split(","), args.clients, args.tokens, Path(stop), grace))
        Path(out).write_text(json.dumps(recs))
        return 0

    import docker
    from e2e_helpers import make_root

    api = docker.APIClient(version="auto")
    subprocess.run([str(REPO / "examples" / "fake-vllm" / "build.sh")], check=True, capture_output=True)
    base = Path(tempfile.mkdtemp(prefix="bench-door-switch-"))
    shm = base / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(base, shm=shm, api=api, name="bench-door-switch")
    bench = Bench(root, args, base)
    t0 = time.monotonic()
    try:
        bench.start()
        print(
            f"set-up (two lanes entered, the night one asleep, the loop and the door up): {time.monotonic() - t0:.0f} s"
        )
        res_b = switches_under_load(bench) if args.only != "c" else None
        res_c = on_demand(bench) if args.only != "b" else None
    finally:
        bench.stop()
        root.manifest()
        root.apply()
        root.cleanup()
        subprocess.run(["umount", "-l", str(shm)], check=False)
    ok = True
    if res_b is not None:
        ok &= report_b(bench, res_b)
    if res_c is not None:
        ok &= report_c(bench, res_c)
    print(
        f"\nin all {time.monotonic() - t0:.0f} s; " + ("every request answered in full" if ok else "a request failed")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
