#!/usr/bin/env python3
"""Benchmark: ``reconciler shm status`` and one ``reconciler shm reclaim`` pass under process churn, as a ratio to a
quiet host (issue 40, item 2).

The churn is what an unprivileged user (uid 65534, through ``setpriv``, the system's Python) makes with a build: one
fork every 2 ms, each child living 0.3 s (about 150 alive at any moment, 500 new a second). Every listing of /proc
shows new processes; the holder scan reads them and ends at the first listing that lost none (docs/design.md, safety
rule 2), where it used to give up after 16 listings ("source unavailable: proc").

A root of its own (a copy of examples/demo, its own host name, lock and state dirs) on a 64 MiB tmpfs: one offload
file mapped by a real process for the whole run, and before each reclaim one orphan made afresh. In interleaved rounds
(each round: the quiet runs, then the storm started, the churn runs, the storm stopped, so machine noise hits both
alike), as whole processes: ``reconciler shm status --json`` and ``reconciler shm reclaim --confirm --json`` (two
inspections ``--confirm-interval`` apart, default 0.05 s, and the write lease). Every run must answer with both
sources up, call the mapped file owned, and the reclaim must remove the orphan and keep the mapped file.

Run as root with a Docker engine: ``python3 tests/bench/bench_shm_churn.py [--rounds 7]``. Prints medians, min, max
and the churn/quiet ratio of each command; exit status 0 when every run answered as above (the ratios are reported,
not enforced: they depend on the machine and its load). The storm, the holder and the mount are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

NOBODY = "65534"
STORM_PYTHON = "/usr/bin/python3"  # the unprivileged user's: the project's environment may be out of its reach
PERIOD_S, LIFE_S = 0.002, 0.3

from attack.helpers import HOLDER, STORM  # noqa: E402 - the fork storm and the holder the attack test runs


class Storm:
    """The fork storm as uid 65534, in a session of its own (stopped with the whole group), at most 120 s long."""

    def __init__(self) -> None:
        as_nobody = ["setpriv", "--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"]
        self.proc = subprocess.Popen(
            [*as_nobody, STORM_PYTHON, "-c", STORM, str(PERIOD_S), str(LIFE_S), "120"],
            stdout=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the fork storm did not start")
        time.sleep(LIFE_S + 0.2)  # full strength: a whole generation alive

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def nobody_processes() -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                n += os.stat(f"/proc/{name}").st_uid == int(NOBODY)
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--confirm-interval", type=float, default=0.05, help="shm.confirm_interval_s of the root")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark mounts a tmpfs and runs the storm as uid 65534")
    for tool in ("setpriv", STORM_PYTHON):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing")

    import docker
    from e2e_helpers import make_root

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "reconciler")], check=True, stdout=subprocess.DEVNULL
    )
    api = docker.APIClient(base_url="unix:///var/run/docker.sock", version="auto", timeout=60)
    work = Path(tempfile.mkdtemp(prefix="bench-shm-churn-"))
    shm = work / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(work, shm=shm, api=api, name="bench-shm-churn", confirm_interval_s=args.confirm_interval)
    env = {**root.env, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "reconciler", "--root", str(root.path)]
    held = shm / "vllm_offload_held.mmap"
    held.write_bytes(b"\xab" * (4 << 20))
    holder = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", HOLDER, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    storm: Storm | None = None
    failures: list[str] = []
    times: dict[str, list[float]] = {}
    live: list[int] = []

    def run(label: str, *cmd: str) -> dict:  # type: ignore[type-arg]
        t0 = time.perf_counter()
        p = subprocess.run([*cli, *cmd], env=env, capture_output=True, text=True, check=False)
        times.setdefault(label, []).append(time.perf_counter() - t0)
        if p.returncode != 0:
            failures.append(f"{label}: exit {p.returncode}: {p.stdout[-400:]} {p.stderr[-400:]}")
            return {}
        return json.loads(p.stdout)

    def measure(setting: str) -> None:
        status = run(f"shm status --json ({setting})", "shm", "status", "--json")
        states = {Path(f["path"]).name: f["state"] for f in status.get("files", ())}
        if status and (status["sources"] != {"proc": "ok", "docker": "ok"} or states.get(held.name) != "owned"):
            failures.append(f"status ({setting}): {status['sources']} {states}")
        orphan = shm / "vllm_offload_orphan.mmap"
        orphan.write_bytes(b"\xcd" * (1 << 20))
        reclaimed = run(f"shm reclaim --confirm --json ({setting})", "shm", "reclaim", "--confirm", "--json")
        gone = [Path(f["path"]).name for f in reclaimed.get("reclaimed", ())]
        if reclaimed and (gone != [orphan.name] or not held.exists()):
            failures.append(f"reclaim ({setting}): reclaimed {gone}, held file there: {held.exists()}")
        if orphan.exists():
            orphan.unlink()

    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mapped"
        quiet_procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
        for _ in range(args.rounds):
            measure("quiet")
            storm = Storm()
            live.append(nobody_processes())
            measure("churn")
            live.append(nobody_processes())
            storm.stop()
            storm = None
        print(
            f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, {quiet_procs} processes when quiet; "
            f"churn: uid 65534 forks every {PERIOD_S * 1000:g} ms, each child lives {LIFE_S:g} s "
            f"({min(live)}..{max(live)} of its processes alive when sampled); "
            f"confirm_interval_s {args.confirm_interval:g}; medians of {args.rounds} interleaved rounds"
        )
        print(f"{'command (whole processes)':44} {'median':>9} {'min':>8} {'max':>8}   (ms)   churn/quiet")
        for label, ts in times.items():
            cells = f"{label:44} {statistics.median(ts) * 1000:9.1f} {min(ts) * 1000:8.1f} {max(ts) * 1000:8.1f}"
            if label.endswith("(churn)"):
                quiet = times[label.replace("(churn)", "(quiet)")]
                cells += f"   {statistics.median(ts) / statistics.median(quiet):6.2f}x"
            print(cells)
    finally:
        if storm is not None:
            storm.stop()
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        subprocess.run(["umount", "-l", str(shm)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
