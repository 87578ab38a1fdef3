#!/usr/bin/env python3
"""Benchmark: the tool's own overhead on top of Docker, measured in one run against the real engine.

Each figure is the median of ``--rounds`` runs:

- enter+leave of a trivial container through ``reconciler apply`` as whole processes (one apply that enters it,
  one that leaves it after the manifest is emptied) versus the same container through ``docker run -d`` /
  ``docker stop`` / ``docker rm``. Goal: at most 1.3x.
- the same enter+leave through ``Applier.converge`` inside one process, as ``reconciler run`` does it: the
  tool's per-action cost without the interpreter's start-up and imports.
- a converged ``reconciler apply`` (the container already running, nothing to do) as a whole process. Goal:
  under 0.5 s.

The trivial container is the fake-vllm image (examples/fake-vllm/, built here when missing) serving health only:
TP=1, no offload, no health URL and ``settle_s = 0``, so an enter is done once the engine says it runs, as
``docker run -d`` is. Rounds alternate between the paths so that engine drift hits them alike. The root is a
temporary copy of examples/demo with a host name, GPU indexes and a lock dir of its own.

Run: ``python3 tests/bench/bench_apply.py [--rounds N]`` (root, a running Docker engine). Exit status 0 when both
goals are met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo"
BUILD = REPO / "examples" / "fake-vllm" / "build.sh"
IMAGE = "reconciler/fake-vllm:latest"
RATIO_GOAL = 1.3
CONVERGED_GOAL_S = 0.5
STOP_TIMEOUT_S = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(cmd: Sequence[str], *, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(list(cmd), check=False, capture_output=True, text=True, env=env, timeout=120)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return seconds


class Bench:
    def __init__(self, workdir: Path):
        self.tag = f"bench-{os.getpid()}"
        self.root = workdir / "root"
        self.shm = workdir / "shm"
        self.shm.mkdir()
        # shm.dir must be a tmpfs mount point (the loader refuses a plain directory): one of its own, as bench_plan.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(self.shm)], check=True)
        shutil.copytree(DEMO, self.root)
        for f in (self.root / "configs" / "recipes").glob("*.toml"):
            f.unlink()
        host = yaml.safe_load((DEMO / "configs" / "host.yaml").read_text())
        host["name"] = self.tag
        host["gpus"] = {"dark-compute-a": {"index": 900}, "dark-compute-b": {"index": 901}}
        host["shm"]["dir"] = str(self.shm)
        (self.root / "configs" / "host.yaml").write_text(yaml.safe_dump(host, sort_keys=False))
        self.port = free_port()
        self.command = ["vllm", "serve", "bench/trivial", "--tensor-parallel-size", "1", "--port", str(self.port)]
        recipe = f"""description = "bench: a trivial container (fake vLLM, health only)"
tensor_parallel_size = 1

[model]
id = "bench/trivial"

[container]
image = "{IMAGE}"
command = {json.dumps(self.command)}
volumes = ["/usr:/usr:ro"]
ipc = "host"
network = "host"
init = true

[health]
settle_s = 0
start_timeout_s = 30

[stop]
timeout_s = {STOP_TIMEOUT_S}
"""
        (self.root / "configs" / "recipes" / "trivial.toml").write_text(recipe)
        self.env = {**os.environ, "RECONCILER_LOCK_DIR": str(workdir / "lock"), "NO_COLOR": "1"}
        self.env.pop("RECONCILER_ROOT", None)
        self.docker_name = f"{self.tag}-plain"

    def manifest(self, on: bool) -> None:
        doc = {"host": self.tag, "assignments": [{"recipe": "trivial", "gpus": ["dark-compute-a"]}] if on else []}
        (self.root / "manifests" / "demo.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    def apply(self) -> float:
        return timed([sys.executable, "-m", "reconciler", "--root", str(self.root), "apply", "--yes"], env=self.env)

    def reconciler_round(self) -> float:
        self.manifest(True)
        enter = self.apply()
        self.manifest(False)
        return enter + self.apply()

    def docker_round(self) -> float:
        name = self.docker_name
        run = timed(
            [
                "docker",
                "run",
                "-d",
                "--name",
                name,
                "--init",
                "--ipc",
                "host",
                "--network",
                "host",
                "-v",
                "/usr:/usr:ro",
                IMAGE,
                *self.command,
            ]
        )
        stop = timed(["docker", "stop", "-t", str(STOP_TIMEOUT_S), name])
        return run + stop + timed(["docker", "rm", name])

    def converged(self) -> float:
        return self.apply()

    def in_process_round(self) -> float:
        """Enter+leave through ``Applier.converge`` in this process: the loop's path, without process start-up."""
        from reconciler.apply.applier import Applier
        from reconciler.load.desired import load_desired

        total = 0.0
        for on in (True, False):
            self.manifest(on)
            t0 = time.perf_counter()
            result = Applier(load_desired(self.root)).converge()
            total += time.perf_counter() - t0
            if result.result != "converged":
                raise SystemExit(f"in-process apply did not converge: {result.to_json()}")
        return total

    def cleanup(self) -> None:
        found: set[str] = set()
        for flt in (f"label=io.reconciler.host={self.tag}", f"name={self.docker_name}"):
            ps = ["docker", "ps", "-aq", "--filter", flt]
            out = subprocess.run(ps, check=False, capture_output=True, text=True).stdout
            found.update(out.split())
        for cid in sorted(found):
            subprocess.run(["docker", "rm", "-f", cid], check=False, capture_output=True)
        subprocess.run(["umount", "-l", str(self.shm)], check=False)


def row(name: str, xs: list[float], goal: str, ok: bool | None) -> str:
    verdict = "" if ok is None else ("ok" if ok else "MISSED")
    return f"{name:<44} {statistics.median(xs):>9.3f} {min(xs):>8.3f} {max(xs):>8.3f}  {goal:<14} {verdict}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds per measurement (default 5)")
    args = ap.parse_args(argv)
    build = subprocess.run(["sh", str(BUILD)], check=False, capture_output=True, text=True)
    if build.returncode != 0:
        raise SystemExit(f"{BUILD} failed: {build.stdout}{build.stderr}")

    with tempfile.TemporaryDirectory(prefix="reconciler-bench-") as tmp:
        b = Bench(Path(tmp))
        try:
            b.reconciler_round()  # warm-up: page cache, image layers, the engine's first container of the run
            b.docker_round()
            os.environ["RECONCILER_LOCK_DIR"] = b.env["RECONCILER_LOCK_DIR"]
            b.in_process_round()
            rec: list[float] = []
            plain: list[float] = []
            inproc: list[float] = []
            for _ in range(args.rounds):
                rec.append(b.reconciler_round())
                plain.append(b.docker_round())
                inproc.append(b.in_process_round())
            b.manifest(True)
            b.apply()
            conv = [b.converged() for _ in range(args.rounds)]
        finally:
            b.cleanup()

    ratio = statistics.median(rec) / statistics.median(plain)
    conv_med = statistics.median(conv)
    inproc_ratio = statistics.median(inproc) / statistics.median(plain)
    print(f"{'measure (seconds, whole processes)':<44} {'median':>9} {'min':>8} {'max':>8}  {'goal':<14}")
    print(row("enter+leave via reconciler apply (2 runs)", rec, "", None))
    print(row("same container via docker run/stop/rm", plain, "", None))
    print(
        f"{'ratio of medians (apply processes / docker)':<44} {ratio:>9.2f} {'':>8} {'':>8}  "
        f"{'<= ' + str(RATIO_GOAL) + 'x':<14} {'ok' if ratio <= RATIO_GOAL else 'MISSED'}"
    )
    print(row("enter+leave via Applier.converge, in process", inproc, "", None))
    print(f"{'ratio of medians (in process / docker)':<44} {inproc_ratio:>9.2f}")
    print(row("converged apply (nothing to do)", conv, f"< {CONVERGED_GOAL_S} s", conv_med < CONVERGED_GOAL_S))
    print(f"rounds: {args.rounds}; python {sys.version.split()[0]}; {os.cpu_count()} CPU(s)")
    return 0 if ratio <= RATIO_GOAL and conv_med < CONVERGED_GOAL_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
