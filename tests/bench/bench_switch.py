#!/usr/bin/env python3
"""Benchmark: the lane switch's downtime, against the real engine, through ``reconciler apply`` as a whole process.

Three lanes of the fake vLLM (examples/fake-vllm/) whose health answers only ``--load-s`` seconds (L) after start:
the exclusive TP=2 lane on both slots, and the split (one lane per slot). Measured, each the median of ``--rounds``:

- exclusive -> split: one leave, then two enters that touch disjoint cards and load at the same time. Goal:
  converged in at most L + 25 % plus the leave (not 2L).
- split -> exclusive: two leaves at once, then one enter. Goal: at most the slower leave + L + 25 % (not two
  leaves in a row).
- each slot's dark time as the apply reports it (``dark_s`` in its enter's outcome), beside what a client of the
  new lane saw: the time from the old lane's leave to its first 200 on /health, polled every 50 ms from here.

Run: ``python3 tests/bench/bench_switch.py [--rounds N] [--load-s L]`` (root, a running Docker engine). Exit status
0 when both goals are met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from e2e_helpers import Root, make_root  # noqa: E402

SLACK = 0.25


def first_healthy(url: str, since: float, stop: threading.Event, out: dict[str, float], key: str) -> None:
    """Poll ``url`` until it answers 200; record the seconds since ``since``."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=0.5) as r:
                if r.status == 200:
                    out[key] = time.monotonic() - since
                    return
        except OSError:
            pass
        time.sleep(0.05)


def switch(root: Root, to: list[tuple[str, list[str]]], watch: dict[str, str]) -> dict[str, Any]:
    """Write the manifest, run one apply, and return its figures."""
    root.manifest(*to)
    stop = threading.Event()
    seen: dict[str, float] = {}
    t0 = time.monotonic()
    threads = [
        threading.Thread(target=first_healthy, args=(url, t0, stop, seen, slot), daemon=True)
        for slot, url in watch.items()
    ]
    for t in threads:
        t.start()
    res = root.apply()
    total = time.monotonic() - t0
    time.sleep(0.2)
    stop.set()
    if res.rc != 0 or res.data["result"] != "converged":
        raise SystemExit(f"the switch did not converge:\n{res}")
    leaves = [a["seconds"] for a in res.data["actions"] if a["kind"] == "leave"]
    dark: dict[str, float] = {}
    for a in res.data["actions"]:
        dark.update(a.get("dark_s") or {})
    return {
        "total": total,
        "leave": max(leaves, default=0.0),
        "dark": dark,
        "client": seen,
        "enters": [a["seconds"] for a in res.data["actions"] if a["kind"] == "enter"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load-s", type=float, default=6.0)
    args = ap.parse_args()
    import docker

    api = docker.APIClient(version="auto")
    subprocess.run([str(REPO / "examples" / "fake-vllm" / "build.sh")], check=True, capture_output=True)
    base = Path(tempfile.mkdtemp(prefix="bench-switch-"))
    shm = base / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(base, shm=shm, api=api, name="bench-switch")
    L = args.load_s
    try:
        mode = f"start-delay={L:g}"
        big = root.recipe("deepseek-256k-offload", offload_mib=8, mode=mode, start_timeout_s=L + 60)
        a = root.recipe("omni", mode=mode, start_timeout_s=L + 60)
        data = root.recipe_data(a)
        b_port = None
        b = f"omni-b-{root.tag}"
        root.recipes["omni-b"] = b
        from e2e_helpers import free_port, set_flag

        b_port = free_port()
        data["container"]["command"] = set_flag(data["container"]["command"], "--port", str(b_port))
        data["health"]["url"] = f"http://127.0.0.1:{b_port}/health"
        data["model"]["id"] = data["container"]["command"][2] = f"e2e/{b}"
        data["probes"] = [p for p in data.get("probes", []) if False]  # the load is what is measured here
        root.write_recipe(b, data)
        for name in (big, a):
            d = root.recipe_data(name)
            d["probes"] = []
            root.write_recipe(name, d)
        exclusive = [(big, ["dark-compute-a", "dark-compute-b"])]
        split = [(a, ["dark-compute-a"]), (b, ["dark-compute-b"])]
        watch_split = {
            "dark-compute-a": f"http://127.0.0.1:{root.port_of(a)}/health",
            "dark-compute-b": f"http://127.0.0.1:{b_port}/health",
        }
        watch_excl = {"dark-compute-a+b": f"http://127.0.0.1:{root.port_of(big)}/health"}
        switch(root, exclusive, {})
        to_split, to_excl = [], []
        for _ in range(args.rounds):
            to_split.append(switch(root, split, watch_split))
            to_excl.append(switch(root, exclusive, watch_excl))
    finally:
        root.manifest()
        root.apply()
        root.cleanup()
        subprocess.run(["umount", "-l", str(shm)], check=False)

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    split_total = med([r["total"] for r in to_split])
    split_leave = med([r["leave"] for r in to_split])
    excl_total = med([r["total"] for r in to_excl])
    excl_leave = med([r["leave"] for r in to_excl])
    goal_split = split_leave + L * (1 + SLACK)
    goal_excl = excl_leave + L * (1 + SLACK)
    print(f"load L = {L:g} s, {args.rounds} rounds, medians")
    print(
        f"exclusive -> split: {split_total:.2f} s (leave {split_leave:.2f} s; goal <= {goal_split:.2f} s; "
        f"in sequence it would be >= {split_leave + 2 * L:.2f} s)"
    )
    print(
        f"split -> exclusive: {excl_total:.2f} s (two leaves at once, the slower {excl_leave:.2f} s; goal <= "
        f"{goal_excl:.2f} s)"
    )
    for r in to_split[-1:]:
        for slot in ("dark-compute-a", "dark-compute-b"):
            print(
                f"  dark {slot}: reported {r['dark'].get(slot, float('nan')):.2f} s, a client saw its new lane "
                f"answer after {r['client'].get(slot, float('nan')):.2f} s"
            )
    ok = split_total <= goal_split and excl_total <= goal_excl
    print("goals met" if ok else "goal missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
