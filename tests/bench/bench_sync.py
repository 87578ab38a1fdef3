#!/usr/bin/env python3
"""Benchmark: ``reconciler sync`` as a whole process, side by side with its peer, ``git fetch`` of the same branch
into a bare clone, in interleaved rounds (every method once per round), medians compared as ratios.

A repository of a fleet (``--hosts`` manifests, default 50, and ``--recipes`` recipes, default 20, under fleet/) is
served from this machine's disk (file://). Timed per round:

- ``git fetch`` (no new commit): the peer, git alone;
- ``reconciler sync`` with no new commit: the fetch, and nothing else to do;
- ``reconciler sync`` of a new commit: the fetch, the commit's files written from its blobs, the whole desired state
  validated with this host file, the record and the audit trail written (a new commit is made before each run).

And ``reconciler validate`` of the same root (the command's start and the desired state loaded from the commit in
use), so the sync's own cost shows apart from the start-up every command pays. Goals: a sync with nothing new
costs at most one ``validate`` and one ``git fetch`` together; a sync of a new commit (which validates that commit
and writes its files) at most twice that.

The root needs a tmpfs for its shm.dir: run as root (``python3 tests/bench/bench_sync.py [--rounds 9]``). Prints a
table; exit 0 when every sync took its commit (the timing goals are reported, met or not). Everything it made is
removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo"
GIT_ID = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--recipes", type=int, default=20)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="reconciler-bench-sync-"))
    shm = base / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    try:
        repo = base / "repo"
        (repo / "fleet" / "manifests").mkdir(parents=True)
        (repo / "fleet" / "configs" / "recipes").mkdir(parents=True)
        omni = (DEMO / "configs" / "recipes" / "omni.toml").read_text()
        for i in range(args.recipes):
            (repo / "fleet" / "configs" / "recipes" / f"omni-{i}.toml").write_text(
                omni.replace('--port", "8001"', f'--port", "{9000 + i}"').replace(":8001/", f":{9000 + i}/")
            )
        for i in range(args.hosts):
            doc = {
                "host": f"gpu-box-{i}",
                "assignments": [{"recipe": f"omni-{i % args.recipes}", "gpus": ["dark-compute-b"]}],
            }
            (repo / "fleet" / "manifests" / f"gpu-box-{i}.yaml").write_text(yaml.safe_dump(doc))
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "the fleet")
        root = base / "root"
        shutil.copytree(DEMO / "configs", root / "configs")
        for f in (root / "configs" / "recipes").glob("*.toml"):
            f.unlink()
        (root / "manifests").mkdir()
        host = yaml.safe_load((root / "configs" / "host.yaml").read_text())
        host["name"] = "gpu-box-0"
        host["shm"]["dir"] = str(shm)
        host["source"] = {"git": f"file://{repo}", "ref": "main", "path": "fleet"}
        (root / "configs" / "host.yaml").write_text(yaml.safe_dump(host, sort_keys=False))
        env = {**os.environ, "RECONCILER_STATE_DIR": str(base / "state"), "RECONCILER_LOCK_DIR": str(base / "lock")}
        env.pop("RECONCILER_ROOT", None)
        sync = [sys.executable, "-m", "reconciler", "--root", str(root), "--json", "sync"]
        bare = base / "peer.git"
        subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
        fetch = [
            "git",
            "--git-dir",
            str(bare),
            "fetch",
            "-q",
            "--no-tags",
            "--",
            f"file://{repo}",
            "+refs/heads/main:refs/peer",
        ]
        subprocess.run(sync, env=env, capture_output=True, check=True)  # the first fetch: the clone made
        subprocess.run(fetch, capture_output=True, check=True)
        validate = [sys.executable, "-m", "reconciler", "--root", str(root), "validate"]
        times: dict[str, list[float]] = {
            "reconciler validate": [],
            "git fetch": [],
            "reconciler sync (nothing new)": [],
            "reconciler sync (a new commit)": [],
        }
        taken = True
        for n in range(args.rounds):
            t0 = time.perf_counter()
            subprocess.run(fetch, capture_output=True, check=True)
            times["git fetch"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run(validate, env=env, capture_output=True, check=True)
            times["reconciler validate"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            r = subprocess.run(sync, env=env, capture_output=True, text=True, check=False)
            times["reconciler sync (nothing new)"].append(time.perf_counter() - t0)
            taken &= r.returncode == 0 and json.loads(r.stdout)["taken"] is False
            (repo / "fleet" / "manifests" / "gpu-box-0.yaml").write_text(
                yaml.safe_dump(
                    {
                        "host": "gpu-box-0",
                        "assignments": [{"recipe": f"omni-{(n + 1) % args.recipes}", "gpus": ["dark-compute-b"]}],
                    }
                )
            )
            git(repo, "commit", "-q", "--allow-empty", "-am", f"round {n}")
            t0 = time.perf_counter()
            r = subprocess.run(sync, env=env, capture_output=True, text=True, check=False)
            times["reconciler sync (a new commit)"].append(time.perf_counter() - t0)
            taken &= r.returncode == 0 and json.loads(r.stdout)["taken"] is True
        unit = statistics.median(times["git fetch"])
        both = unit + statistics.median(times["reconciler validate"])
        goals = {"reconciler sync (nothing new)": 1.0, "reconciler sync (a new commit)": 2.0}
        print(f"{args.hosts} manifests, {args.recipes} recipes, {args.rounds} rounds; medians")
        for name, ts in times.items():
            med = statistics.median(ts)
            goal = goals.get(name)
            verdict = (
                ""
                if goal is None
                else f"  {med / both:4.2f}x validate + fetch, goal <= {goal:g}x: {'met' if med / both <= goal else 'MISSED'}"
            )
            print(f"  {name:<32} {med * 1000:8.1f} ms  {med / unit:5.2f}x git fetch{verdict}")
        print("every sync took its commit" if taken else "A SYNC DID NOT TAKE ITS COMMIT")
        return 0 if taken else 1
    finally:
        subprocess.run(["umount", "-l", str(shm)], check=False)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
