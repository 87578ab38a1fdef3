#!/usr/bin/env python3
"""Benchmark: a switch in seconds. Sleeping lanes against cold starts, against the real engine, each switch one
``reconciler switch NAME --wait`` as a whole process.

Lanes of the fake vLLM (examples/fake-vllm/) with sleep mode whose cold load takes ``--load-s`` seconds (L, 20 by
default: health answers only then) and whose wake takes ``--wake-s`` (1 by default): the split (small-a, small-b, one
per slot) and the exclusive TP=2 lane (big), both topologies on standby; and a third topology, mixed (small-a and
small-c, small-c never entered), off standby. Measured, in one run:

- standby switches, split -> exclusive and back, ``--rounds`` each: goal at most 3 s each (sleep, wake, probes);
- the same switch cold (the manifest without standby:, so the old lanes leave and the new ones load): at least L;
- a switch to mixed, which holds one cold lane: goal at most L + 3 s (that lane's load and no more);
- each slot's dark time as the switch reports it (``dark_s`` of its wake or enter) beside what a client saw: every
  50 ms a chat completion to each lane; a slot is dark from its old lane's last answer to its new lane's first.
  Goal: the two within 0.5 s.

Run: ``python3 tests/bench/bench_sleep_switch.py [--rounds N] [--load-s L] [--wake-s W]`` (root, a running Docker
engine). Exit status 0 when every goal is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from e2e_helpers import Root, make_root  # noqa: E402

A, B = "dark-compute-a", "dark-compute-b"


class Client:
    """One lane asked every 50 ms for a completion: the times it answered 200."""

    def __init__(self, port: int, model: str):
        self.port, self.model = port, model
        self.ok: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "ping"}]}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body)
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        self.ok.append(time.monotonic())
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)

    def last_before(self, t: float) -> float | None:
        xs = [x for x in self.ok if x <= t]
        return xs[-1] if xs else None

    def first_after(self, t: float) -> float | None:
        xs = [x for x in self.ok if x >= t]
        return xs[0] if xs else None


def manifest(root: Root, running: str, lanes: dict[str, str], *, standby: bool) -> None:
    a, b, c, big = lanes["small-a"], lanes["small-b"], lanes["small-c"], lanes["big"]
    root.write_manifest_text(
        f"host: {root.host}\ntopology: {running}\n"
        + ("standby: [split, exclusive]\n" if standby else "")
        + "topologies:\n"
        f"  split:\n    - {{recipe: {a}, gpus: [{A}]}}\n    - {{recipe: {b}, gpus: [{B}]}}\n"
        f"  exclusive:\n    - {{recipe: {big}, gpus: [{A}, {B}]}}\n"
        f"  mixed:\n    - {{recipe: {a}, gpus: [{A}]}}\n    - {{recipe: {c}, gpus: [{B}]}}\n"
    )


def switch(root: Root, name: str, old: dict[str, Client], new: dict[str, Client]) -> dict[str, Any]:
    """``reconciler switch NAME --wait`` timed; per slot the dark time reported and the one clients saw."""
    t0 = time.monotonic()
    res = root.cli("switch", name, "--wait", "--json", timeout=600)
    total = time.monotonic() - t0
    time.sleep(0.5)
    if res.rc != 0:
        raise SystemExit(f"switch {name} failed:\n{res}")
    reported: dict[str, float] = {}
    for a in res.data["actions"]:
        reported.update(a.get("dark_s") or {})
    seen: dict[str, float] = {}
    for slot, client in new.items():
        first = client.first_after(t0)
        last = old[slot].last_before(first) if first is not None and slot in old else None
        if first is not None and last is not None:
            seen[slot] = first - last
    kinds = sorted(f"{a['kind']} {a['recipe']} {a['seconds']:.2f}s" for a in res.data["actions"])
    return {"total": total, "reported": reported, "seen": seen, "actions": kinds}


def step(res: Any, what: str) -> None:
    if res.rc != 0:
        raise SystemExit(f"{what} failed:\n{res}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--wake-s", type=float, default=1.0)
    args = ap.parse_args()
    import docker

    api = docker.APIClient(version="auto")
    subprocess.run([str(REPO / "examples" / "fake-vllm" / "build.sh")], check=True, capture_output=True)
    base = Path(tempfile.mkdtemp(prefix="bench-sleep-"))
    shm = base / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(base, shm=shm, api=api, name="bench-sleep")
    L, W = args.load_s, args.wake_s
    mode = f"start-delay={L:g},wake-delay={W:g}"
    lanes = {
        label: root.sleeping_recipe(label, tp=2 if label == "big" else 1, mode=mode, start_timeout_s=L + 60)
        for label in ("small-a", "small-b", "small-c", "big")
    }
    clients: dict[str, Client] = {}
    results: dict[str, list[dict[str, Any]]] = {"to-exclusive": [], "to-split": []}
    try:
        manifest(root, "split", lanes, standby=True)
        t0 = time.monotonic()
        first = root.apply()
        if first.rc != 0:
            raise SystemExit(f"the first apply failed:\n{first}")
        print(f"first apply (every lane cold, the standby one put to sleep): {time.monotonic() - t0:.1f} s")
        clients = {label: Client(root.port_of(name), f"e2e/{name}") for label, name in lanes.items()}
        split = {A: clients["small-a"], B: clients["small-b"]}
        excl = {A: clients["big"], B: clients["big"]}
        for _ in range(args.rounds):
            results["to-exclusive"].append(switch(root, "exclusive", split, excl))
            results["to-split"].append(switch(root, "split", excl, split))
        # The same switch cold: without standby: the sleeping exclusive lane leaves first, then the split leaves
        # and the exclusive lane loads from nothing.
        manifest(root, "split", lanes, standby=False)
        step(root.apply(), "the apply without standby")
        cold = switch(root, "exclusive", split, excl)
        # Back on standby (the split entered again, cold, and put to sleep), then a topology with one lane never
        # entered: small-a wakes, small-c loads beside sleeping small-b: that lane's load, and no more.
        manifest(root, "exclusive", lanes, standby=True)
        step(root.cli("switch", "split", "--wait", "--json", timeout=600), "the switch back on standby")
        step(root.cli("switch", "exclusive", "--wait", "--json", timeout=600), "the warm switch")
        mixed = switch(root, "mixed", excl, {A: clients["small-a"], B: clients["small-c"]})
    finally:
        for c in clients.values():
            c.stop.set()
        root.manifest()
        root.apply()
        root.cleanup()
        subprocess.run(["umount", "-l", str(shm)], check=False)

    ok = True
    print(f"cold load L = {L:g} s, wake W = {W:g} s, {args.rounds} rounds (medians)")
    for name, runs in results.items():
        med = statistics.median(r["total"] for r in runs)
        good = med <= 3.0
        ok &= good
        print(f"standby switch {name}: {med:.2f} s (goal <= 3 s: {'met' if good else 'MISSED'}); {runs[-1]['actions']}")
    print(
        f"cold switch to-exclusive: {cold['total']:.2f} s (at least L = {L:g} s: {cold['total'] >= L}); {cold['actions']}"
    )
    ratio = cold["total"] / statistics.median(r["total"] for r in results["to-exclusive"])
    print(f"  standby is {ratio:.1f}x faster than cold")
    good = mixed["total"] <= L + 3.0
    ok &= good
    print(
        f"switch to mixed (one cold lane): {mixed['total']:.2f} s (goal <= L + 3 = {L + 3:g} s: "
        f"{'met' if good else 'MISSED'}); {mixed['actions']}"
    )
    worst = 0.0
    for name, runs in results.items():
        r = runs[-1]
        for slot in (A, B):
            rep, seen = r["reported"].get(slot), r["seen"].get(slot)
            if rep is None or seen is None:
                print(f"  {name} dark {slot}: reported {rep}, client saw {seen} (missing)")
                ok = False
                continue
            worst = max(worst, abs(rep - seen))
            print(f"  {name} dark {slot}: reported {rep:.2f} s, a client saw {seen:.2f} s")
    good = worst <= 0.5
    ok &= good
    print(f"dark time reported within {worst:.2f} s of what clients saw (goal <= 0.5 s: {'met' if good else 'MISSED'})")
    print("goals met" if ok else "goal missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
