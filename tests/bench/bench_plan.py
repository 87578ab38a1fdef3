#!/usr/bin/env python3
"""Benchmark: `plan` (observe + plan) on a busy host, and the pure planner's scaling.

Sets up, against the real Docker engine and a real tmpfs:
  - 50 containers (10 running, 40 created; a mix of managed, GPU-holding and plain ones),
  - 200 offload files on a tmpfs, 20 of them mapped by live processes,
then measures
  - whole process: `python -m reconciler --root ROOT plan --json` (median of N runs),
  - in-process: observe + plan with a warm observer (the loop's case) and with a cold one,
  - the pure planner alone for 10, 100, 1000 and 2000 assignments (it should scale linearly).
Cleans up everything it made. Needs root (tmpfs mount) and a Docker engine; the fake vLLM image
(examples/fake-vllm/build.sh) is used as the container image.

    python3 tests/bench/bench_plan.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

IMAGE = "reconciler/fake-vllm:latest"
HOST = "bench"
LABEL = "io.reconciler.bench"


def sh(*cmd: str, check: bool = True) -> str:
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout.strip()


def median_ms(samples: list[float]) -> str:
    return (
        f"{statistics.median(samples) * 1000:8.1f} ms  (min {min(samples) * 1000:.1f}, max {max(samples) * 1000:.1f})"
    )


def setup_root(shm_dir: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix="reconciler-bench-"))
    shutil.copytree(REPO / "examples/demo/configs", root / "configs")
    (root / "manifests").mkdir()
    host = (root / "configs/host.yaml").read_text()
    host = host.replace("name: demo", f"name: {HOST}").replace("dir: /dev/shm", f"dir: {shm_dir}")
    (root / "configs/host.yaml").write_text(host)
    (root / "manifests/bench.yaml").write_text(
        f"host: {HOST}\nassignments:\n  - recipe: deepseek-256k-offload\n    gpus: [dark-compute-a, dark-compute-b]\n"
    )
    return root


def make_containers() -> None:
    sh("examples/fake-vllm/build.sh")
    for n in range(50):
        args = ["docker", "create", "--label", f"{LABEL}=1", "-v", "/usr:/usr:ro", "--name", f"bench-{n:02d}"]
        if n % 5 == 0:
            args += ["-e", f"NVIDIA_VISIBLE_DEVICES={2 + n}"]  # GPU ids that are not this host's slots
        if n % 7 == 0:
            args += ["--label", "io.reconciler.managed=true", "--label", "io.reconciler.host=elsewhere"]
        args += [IMAGE, "/usr/bin/sleep", "3600"]
        sh(*args)
        if n < 10:
            sh("docker", "start", f"bench-{n:02d}")


def remove_containers() -> None:
    ids = sh("docker", "ps", "-aq", "--filter", f"label={LABEL}=1", check=False).split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)


def make_files(shm_dir: str) -> list[subprocess.Popen[bytes]]:
    paths = []
    for n in range(200):
        p = Path(shm_dir) / f"vllm_offload_bench-{n:03d}.mmap"
        with open(p, "wb") as fh:
            fh.truncate(64 * 1024)
        paths.append(str(p))
    # 20 files mapped by 10 live processes (2 each), so ownership is really looked up.
    holders = []
    code = (
        "import mmap,sys,time\n"
        "fs=[open(p,'r+b') for p in sys.argv[1:]]\n"
        "ms=[mmap.mmap(f.fileno(),0) for f in fs]\n"
        "print('ok',flush=True); time.sleep(3600)\n"
    )
    for i in range(10):
        proc = subprocess.Popen([sys.executable, "-c", code, *paths[2 * i : 2 * i + 2]], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
        holders.append(proc)
    return holders


def bench_pure(sizes: list[int]) -> list[tuple[int, float]]:
    from planner_fixtures import make_recipe

    from reconciler.model import DesiredAssignment, DesiredState, HostConfig
    from reconciler.plan.observed import observation
    from reconciler.plan.planner import plan

    out = []
    recipe = make_recipe(tp=1)
    for n in sizes:
        host = HostConfig.model_validate(
            {"name": "h", "gpus": {f"s{i}": {"index": i} for i in range(n)}, "gpu_telemetry": "none"}
        )
        assignments = tuple(DesiredAssignment("r", (f"s{i}",), recipe.content_hash(), 0) for i in range(n))
        desired = DesiredState(host=host, recipes={"r": recipe}, assignments=assignments)
        observed = observation("h")
        reps = max(3, 2000 // n)
        t0 = time.perf_counter()
        for _ in range(reps):
            plan(desired, observed)
        out.append((n, (time.perf_counter() - t0) / reps))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    os.chdir(REPO)
    shm_dir = tempfile.mkdtemp(prefix="reconciler-bench-shm-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", shm_dir], check=True)
    holders: list[subprocess.Popen[bytes]] = []
    root = None
    try:
        remove_containers()
        make_containers()
        holders = make_files(shm_dir)
        root = setup_root(shm_dir)

        from reconciler.load.desired import load_desired
        from reconciler.observe import observe
        from reconciler.observe.containers import EngineObserver
        from reconciler.plan.planner import plan

        n_containers = len(sh("docker", "ps", "-aq").split())
        n_files = len(list(Path(shm_dir).glob("vllm_offload_*.mmap")))
        print(
            f"host: {n_containers} containers in the engine, {n_files} offload files, "
            f"{len([p for p in os.listdir('/proc') if p.isdigit()])} processes, {os.cpu_count()} cores"
        )

        whole = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            res = subprocess.run(
                [sys.executable, "-m", "reconciler", "--root", str(root), "plan", "--json"],
                capture_output=True,
                text=True,
            )
            whole.append(time.perf_counter() - t0)
            assert res.returncode in (0, 2, 3), res.stderr
        desired = load_desired(root)
        warm_obs = EngineObserver(desired.host.docker.url)
        observe(desired.host, docker=warm_obs)
        warm, cold, pure_share = [], [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            observed = observe(desired.host, docker=warm_obs)
            t1 = time.perf_counter()
            p = plan(desired, observed)
            t2 = time.perf_counter()
            warm.append(t2 - t0)
            pure_share.append(t2 - t1)
            t0 = time.perf_counter()
            plan(desired, observe(desired.host, docker=EngineObserver(desired.host.docker.url)))
            cold.append(time.perf_counter() - t0)
        print(
            f"plan: {len(p.actions)} action(s), blocked={p.blocked}, files seen={len(observed.shm.files)}, "
            f"containers seen={len(observed.containers)}"
        )
        print(f"whole process  `reconciler plan --json`     {median_ms(whole)}")
        print(f"in-process observe+plan, warm observer       {median_ms(warm)}")
        print(f"in-process observe+plan, cold observer       {median_ms(cold)}")
        print(f"  of which the pure planner                  {median_ms(pure_share)}")
        print("pure planner scaling (assignments -> time per plan, time per assignment):")
        for n, s in bench_pure([10, 100, 1000, 2000]):
            print(f"  {n:5d}  {s * 1e3:8.3f} ms   {s / n * 1e6:7.2f} us/assignment")
    finally:
        for h in holders:
            h.kill()
            h.wait()
        remove_containers()
        subprocess.run(["umount", "-l", shm_dir], check=False)
        os.rmdir(shm_dir)
        if root:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
