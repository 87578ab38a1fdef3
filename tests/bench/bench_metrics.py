#!/usr/bin/env python3
"""Benchmark: how long one ``/metrics`` scrape (``Metrics.render()``) takes. Goal: well under 10 ms.

Runnable on its own (``python3 tests/bench/bench_metrics.py [--renders N] [--json]``). It builds a busy but
realistic state: the field report's two GPU slots with owners and telemetry, every recipe of a host with a
few in backoff, 64 offload files, and histograms that have seen thousands of passes and actions. Then it renders
N times, with and without a concurrent writer (the loop updating while Prometheus scrapes), and prints the
percentiles. Exits 1 when the p99 of either run is at or above the goal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reconciler.loop.metric_families import ACTION_KINDS, ACTION_RESULTS, PASS_RESULTS, REFUSAL_REASONS
from reconciler.loop.metrics import Metrics
from reconciler.model import HostConfig
from reconciler.plan.actions import Action, ActionKind, Plan
from reconciler.plan.observed import (
    LABEL_HOST,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SLOTS,
    ContainerView,
    GpuProcess,
    GpuSlotView,
    GpuView,
    Observed,
    Owner,
    Reading,
    ShmFile,
    ShmView,
    Tmpfs,
    observation,
)

GOAL_S = 0.010
GiB = 1024**3
RECIPES = [
    "deepseek-v4-flash-0731-r16-b12x-dspark5-256k-offload8-wsl2-mmap-unpinned",
    "deepseek-v4-flash-0731-r16-b12x-dspark5-256k-offload16-wsl2-mmap-unpinned",
    "deepseek-v4-flash-0731-r16-b12x-dspark5-256k-131k",
    "omni",
    "demo-small",
    "demo-offload",
]


def busy_state() -> tuple[HostConfig, Observed, Plan]:
    host = HostConfig.model_validate(
        {"name": "workstation", "gpus": {"dark-compute-a": {"index": 0}, "dark-compute-b": {"index": 1}}}
    )
    labels = {LABEL_MANAGED: "true", LABEL_RECIPE: "omni", LABEL_SLOTS: "dark-compute-b", LABEL_HOST: "workstation"}
    omni = ContainerView(
        id="a" * 64, name="reconciler-omni-dark-compute-b", state="running", image="img", labels=labels
    )
    other = ContainerView(id="b" * 64, name="notebook", state="running", image="img", gpu_devices=("0",))
    stopped = [ContainerView(id=f"{i:064x}", name=f"old-{i}", state="exited", image="img") for i in range(20)]
    slots = {
        "dark-compute-a": GpuSlotView(
            slot="dark-compute-a",
            index=0,
            uuid="GPU-a",
            memory_total_bytes=141 * GiB,
            memory_used_bytes=3 * GiB,
            processes=(GpuProcess(pid=11, used_bytes=GiB, container_id=other.id), GpuProcess(pid=12, used_bytes=GiB)),
        ),
        "dark-compute-b": GpuSlotView(
            slot="dark-compute-b",
            index=1,
            uuid="GPU-b",
            memory_total_bytes=141 * GiB,
            memory_used_bytes=90 * GiB,
            processes=tuple(GpuProcess(pid=100 + i, used_bytes=GiB, container_id=omni.id) for i in range(8)),
        ),
    }
    files = tuple(
        ShmFile(
            path=f"/dev/shm/vllm_offload_{i}.mmap",
            dev=42,
            inode=1000 + i,
            size_bytes=GiB // 8,
            allocated_bytes=GiB // 8,
            state=("owned", "orphan", "blocked")[i % 3],
            owners=(Owner(pid=100, via="map", container="omni"),) if i % 3 == 0 else (),
        )
        for i in range(64)
    )
    shm = ShmView(
        dir="/dev/shm",
        pattern="vllm_offload_*.mmap",
        tmpfs=Tmpfs(64 * GiB, 8 * GiB, 56 * GiB),
        proc=Reading("proc", True),
        docker=Reading("docker", True),
        files=files,
        deleted_mapped_bytes=GiB,
    )
    observed = observation(
        "workstation",
        containers=(omni, other, *stopped),
        gpus=GpuView(telemetry="nvml", reading=Reading("gpu", True), slots=slots),
        shm=shm,
        docker=shm.docker,
    )
    plan = Plan(host="workstation", actions=(Action(kind=ActionKind.RECLAIM, reason="orphans", bytes=GiB),))
    return host, observed, plan


def loaded_metrics() -> tuple[Metrics, Observed, Plan]:
    host, observed, plan = busy_state()
    m = Metrics(host, recipes=RECIPES)
    m.observe_state(observed, plan)
    for i in range(5000):
        m.record_pass(PASS_RESULTS[i % len(PASS_RESULTS)], (i % 977) * 0.37)
        m.record_action(ACTION_KINDS[i % 3], ACTION_RESULTS[i % 3], (i % 613) * 1.3)
    for reason in REFUSAL_REASONS:
        m.record_refusal(reason)
    m.record_reclaim(8 * GiB)
    m.set_manifest_valid(False, "manifests/workstation.yaml:4: unknown recipe 'nope'")
    for recipe in RECIPES[:2]:
        m.set_backoff(recipe, time.time() + 300, failures=3)
    return m, observed, plan


def measure(m: Metrics, renders: int) -> list[float]:
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        m.render()
        times.append(time.perf_counter() - started)
    return times


def summary(times: list[float]) -> dict[str, float]:
    s = sorted(times)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] * 1000

    return {
        "renders": len(s),
        "mean_ms": statistics.fmean(s) * 1000,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": s[-1] * 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renders", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    m, observed, plan = loaded_metrics()
    body = m.render()
    measure(m, 50)  # warm-up
    idle = summary(measure(m, args.renders))

    stop = threading.Event()
    updates = [0]

    def writer() -> None:
        # The loop's pace is seconds per pass; this writes as fast as it can, the worst case for the lock.
        while not stop.is_set():
            m.observe_state(observed, plan)
            m.record_pass("converged", 0.02)
            updates[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=writer)
    t.start()
    try:
        busy = summary(measure(m, args.renders))
    finally:
        stop.set()
        t.join()

    result: dict[str, Any] = {
        "goal_ms": GOAL_S * 1000,
        "bytes": len(body),
        "samples": sum(1 for ln in body.splitlines() if not ln.startswith(b"#")),
        "idle": idle,
        "with_writer": busy,
        "writer_updates": updates[0],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"/metrics body: {result['bytes']} bytes, {result['samples']} samples")
        for name in ("idle", "with_writer"):
            r = result[name]
            print(
                f"{name:12s} renders={r['renders']} mean={r['mean_ms']:.3f} ms p50={r['p50_ms']:.3f} ms "
                f"p95={r['p95_ms']:.3f} ms p99={r['p99_ms']:.3f} ms max={r['max_ms']:.3f} ms"
            )
        print(f"goal: p99 under {GOAL_S * 1000:.0f} ms")
    ok = idle["p99_ms"] < GOAL_S * 1000 and busy["p99_ms"] < GOAL_S * 1000
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
