#!/usr/bin/env python3
"""Benchmark: the status page (``reconciler.api.page``), two figures against their goals.

- server-side time of one page: the host's status with 2 GPU slots (an hour of free VRAM each), 4 lanes (each with
  its probe suites), 20 audit records and 403 offload files (3 of them orphans) with 2,000 owners between them,
  through the redaction boundary and rendered whole (the live part and the page around it), ``--renders`` times
  (default 50). Goal: p99 under 300 ms.
- the loop's idle CPU with the page open: a real ``reconciler run`` on a per-run copy of examples/demo
  (tests/e2e_helpers.py), omni serving, asked for ``/page/live`` once a second as the page's script asks (with its
  ETag), over ``--idle-seconds`` (default 60), against the same window with no page open. CPU time of the process
  (utime + stime from /proc/PID/stat) per wall second. Goal: under 1 % of one core with the page open.

Run: ``python3 tests/bench/bench_page.py [--renders N] [--idle-seconds S] [--render-only]`` (the second figure as
root with a running Docker engine). Prints a table; exit status 0 when every goal is met.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/e2e_helpers.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reconciler.api.page import sections
from reconciler.api.page.snapshot import PageData, live_html
from reconciler.api.page.templates import render
from reconciler.base.redact import redact_data

RENDER_P99_GOAL_MS = 300.0
IDLE_CPU_GOAL_PCT = 1.0
GiB = 1 << 30
SLOTS = ("dark-compute-a", "dark-compute-b")
LANES = (  # recipe, slots, wanted
    ("deepseek-v4-flash-0731-r16-b12x-dspark5-256k-offload8-wsl2-mmap-unpinned", ("dark-compute-a",), True),
    ("omni", ("dark-compute-b",), True),
    ("deepseek-v4-flash-0731-r16-b12x-dspark5-256k-offload16-wsl2-mmap-unpinned", SLOTS, False),
    ("deepseek-v4-flash-0731-r16-b12x-dspark5-256k-131k", ("dark-compute-b",), False),
)


def busy_page(files: int = 403, owners_each: int = 5) -> PageData:
    containers = [
        {
            "name": f"reconciler-{recipe}-{'-'.join(slots)}",
            "id": f"{i:012x}",
            "state": "running",
            "recipe": recipe,
            "slots": list(slots),
            "owner": "ours",
            "healthy": i != 2,
            "preserved": False,
            "sleeping": i == 1,
        }
        for i, (recipe, slots, _) in enumerate(LANES)
    ]
    slots = {
        slot: {
            "desired": next(r for r, s, w in LANES if w and slot in s),
            "index": n,
            "name": "NVIDIA H200",
            "containers": [c for c in containers if slot in c["slots"]],
            "processes": [
                {
                    "pid": 1000 + n * 10 + k,
                    "used_bytes": 9 * GiB,
                    "container": containers[k]["name"],
                    "command": "vllm serve --api-key sk-abcdefghijklmnopqrstuvwx",
                }
                for k in range(3)
            ],
            "free": False,
            "unknown": [],
            "memory_total_bytes": 141 * GiB,
            "memory_used_bytes": 120 * GiB,
            "memory_free_bytes": 21 * GiB,
            "reserve_bytes": 3 * GiB,
            "below_reserve": False,
            "unlisted_used_bytes": GiB,
        }
        for n, slot in enumerate(SLOTS)
    }
    probes = [{"name": f"probe-{k}", "ok": True, "seconds": 0.2} for k in range(9)]
    suites = {
        r: {
            s: {"passed": 9, "planned": 9, "started": time.time() - 60, "probes": probes}
            for s in ("preflight", "regression")
        }
        for r, _, _ in LANES
    }
    status = {
        "host": "workstation",
        "converged": False,
        "sources": {"docker": "ok", "proc": "ok", "gpu": "ok"},
        "slots": slots,
        "containers": containers,
        "install_id": "f" * 32,
        "shm": {
            "dir": "/dev/shm",
            "tmpfs": {"size_bytes": 64 * GiB, "used_bytes": 40 * GiB, "free_bytes": 24 * GiB},
            "files": {"owned": {"count": files - 3, "bytes": 30 * GiB}, "orphan": {"count": 3, "bytes": GiB}},
            "deleted_mapped_bytes": 0,
        },
        "plan": {
            "changes": True,
            "blocked": False,
            "actions": [
                {"kind": "leave", "recipe": r, "gpus": list(s), "reason": "no longer wanted"}
                for r, s, w in LANES
                if not w
            ],
            "blockers": [],
            "held": [],
            "fallbacks": [],
        },
        "probe_suites": suites,
    }
    shm_files = [
        {
            "path": f"/dev/shm/vllm_offload_{i:05d}.mmap",
            "state": "owned" if i > 2 else "orphan",
            "allocated_bytes": 80 << 20,
            "owners": [
                {"pid": 2000 + i * owners_each + k, "container": containers[k % 4]["name"], "via": "map"}
                for k in range(owners_each if i > 2 else 0)
            ],
        }
        for i in range(files)
    ]
    audit = [
        {
            "time": time.time() - k,
            "front": "web",
            "who": "ops-token",
            "action": "apply",
            "outcome": "converged",
            "plan": "a" * 32,
        }
        for k in range(20)
    ]
    recipes = {
        r: {"model": "deepseek-ai/DeepSeek-V4-Flash-0731@9e165c30e2704aec", "image": "anvil-vllm@sha256:331b"}
        for r, _, _ in LANES
    }
    now = time.time()
    history = {slot: [(now - 3600 + k * 30, (20 + k % 7) * GiB) for k in range(120)] for slot in SLOTS}
    health = {"last_pass": {"result": "converged", "at": now}}
    return PageData(status, shm_files, audit, health, recipes, {}, vram_history=history)


def render_once(d: PageData) -> int:
    """What a request costs the server: the values through the redaction boundary, the live part, the page."""
    d = PageData(
        redact_data(d.status),
        redact_data(d.files),
        redact_data(d.audit),
        d.health,
        redact_data(d.recipes),
        {},
        vram_history=d.vram_history,
    )
    live = live_html(d)
    actions = sections.actions_section(
        "c" * 43, topologies=("split", "exclusive"), topology="split", recipes=[r for r, _, _ in LANES]
    )
    page = render(
        "page.html", host="workstation", grafana="#", csrf="c" * 43, flash="", etag="e", live=live, actions=actions
    )
    return len(page)


def render_figures(n: int) -> tuple[list[float], int, int]:
    d = busy_page()
    owners = sum(len(f["owners"]) for f in d.files)
    size = render_once(d)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        render_once(d)
        times.append((time.perf_counter() - t) * 1000)
    return times, owners, size


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_figures(seconds: float) -> dict[str, Any]:
    import docker
    from e2e_helpers import LoopProcess, build_image, make_root

    api = docker.APIClient(base_url="unix:///var/run/docker.sock", version="auto", timeout=30)
    build_image()
    base = Path(tempfile.mkdtemp(prefix="bench-page-"))
    shm = base / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(base, shm=shm, api=api, name="bench-page")
    token = "bench-page-token-" + "x" * 20
    tf = base / "token"
    tf.write_text(token + "\n")
    tf.chmod(0o600)
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    lp = LoopProcess(root, "--api-token-file", str(tf))
    out: dict[str, Any] = {}
    try:
        lp.wait("pass", result="converged", timeout=90)
        time.sleep(3)
        host, port = lp.addr.split(":")

        def ask(method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None) -> Any:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request(method, path, body=body, headers={"Host": lp.addr, **(headers or {})})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            return resp

        resp = ask(
            "POST",
            "/page/login",
            urllib.parse.urlencode({"token": token}),
            {"Content-Type": "application/x-www-form-urlencoded", "Origin": f"http://{lp.addr}"},
        )
        cookie = {"Cookie": resp.getheader("set-cookie").split(";")[0]}
        ask("GET", "/", headers=cookie)
        for label, page_open in (("closed", False), ("open", True)):
            passes0 = lp.healthz()[1].get("passes", 0)
            cpu0, t0 = proc_cpu_s(lp.proc.pid), time.monotonic()
            etag, statuses = "", {200: 0, 304: 0}
            while time.monotonic() - t0 < seconds:
                if page_open:
                    r = ask("GET", "/page/live", headers={**cookie, **({"If-None-Match": etag} if etag else {})})
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    etag = r.getheader("etag") or etag
                time.sleep(1.0)
            cpu1, t1 = proc_cpu_s(lp.proc.pid), time.monotonic()
            out[label] = {
                "cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
                "passes": lp.healthz()[1].get("passes", 0) - passes0,
                "answers": statuses if page_open else {},
            }
    finally:
        lp.stop()
        root.cleanup()
        subprocess.run(["umount", "-l", str(shm)], check=False)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renders", type=int, default=50, help="renders timed (default 50)")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="each idle window (default 60)")
    ap.add_argument("--render-only", action="store_true", help="the first figure alone (no engine, no root)")
    args = ap.parse_args()
    ok = True
    times, owners, size = render_figures(args.renders)
    p50, p99 = statistics.median(times), sorted(times)[max(0, int(len(times) * 0.99) - 1)]
    ok &= p99 < RENDER_P99_GOAL_MS
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    print(f"page with {len(SLOTS)} slots, {len(LANES)} lanes, {owners} offload-file owners ({size} bytes of HTML):")
    print(
        f"  server-side render p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(times):.1f} ms"
        f"  (goal p99 < {RENDER_P99_GOAL_MS:.0f} ms: {'ok' if p99 < RENDER_P99_GOAL_MS else 'MISSED'})"
    )
    if args.render_only:
        return 0 if ok else 1
    if os.geteuid() != 0:
        raise SystemExit("run as root for the idle figure: it mounts a tmpfs for the offload dir (or --render-only)")
    idle = idle_figures(args.idle_seconds)
    for label in ("closed", "open"):
        f = idle[label]
        print(
            f"  loop idle CPU, page {label}: {f['cpu_pct']:.2f} % of a core over {args.idle_seconds:.0f} s"
            f" ({f['passes']} passes{', answers ' + str(f['answers']) if f['answers'] else ''})"
        )
    opened = idle["open"]["cpu_pct"]
    ok &= opened < IDLE_CPU_GOAL_PCT
    print(
        f"  goal: under {IDLE_CPU_GOAL_PCT:g} % with the page open: {'ok' if opened < IDLE_CPU_GOAL_PCT else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
