#!/usr/bin/env python3
"""Benchmark: the commands people run, as whole processes, side by side with their peers in one run (issue 14),
stand-alone and answered by a running loop (issue 19, reconciler.control).

Two settings, each measured in interleaved rounds (every method once per round, so machine noise hits all alike),
medians compared as ratios:

1. An idle host: a root of its own (a copy of examples/demo with its own host name, GPU ids, lock and state dirs,
   a 64 MiB tmpfs as shm.dir) whose manifest puts one trivial container (the fake-vllm image, health only) on a
   slot, applied once so the host is converged. Timed: ``docker ps -a`` (one engine call from a compiled CLI: the
   unit), ``reconciler --help``, ``reconciler plan --json`` and a converged ``reconciler apply --yes``, all
   stand-alone; then, with ``reconciler run`` running for the host, ``plan --json``, ``status --json`` and a
   converged ``apply --yes`` answered by it, beside ``docker ps -a`` again.
   Goals: --help <= 6x, plan --json <= 12x, converged apply <= 16x ``docker ps -a`` stand-alone; plan --json and
   status --json <= 6x, converged apply <= 8x with the loop.
2. A busy host: ``--children`` (default 2,000) forked processes that each hold 8 offload files open and map 4
   (tests/bench/bench_shm_inspect.py's set-up) on the same root's tmpfs. Timed: ``reconciler shm status`` and
   ``shm status --json`` stand-alone and ``shm status --json`` answered by the loop, against ``fuser -v`` on the
   same files (whose verdicts must be identical: which pids hold each file) and the floor
   ``cat /proc/[0-9]*/maps`` (the kernel formatting every mapping once).
   Goals: stand-alone at most 0.6x ``fuser -v``, answered by the loop at most 0.5x; each at most 2x the floor.

Answered by the loop, each command's output must be the stand-alone output (the same command with
``RECONCILER_NO_LOOP=1`` beside the same loop; times aside): checked on every round's first run.

The package is byte-compiled first (``compileall``), as an installed package is: the shell running this may set
PYTHONDONTWRITEBYTECODE, and compiling every module on each start is no cost a user pays.

Run as root with a Docker engine: ``python3 tests/bench/bench_commands.py [--rounds 9] [--children 2000]``.
Prints a table; exit status 0 when the verdicts match fuser's (the timing goals are reported, met or not: they
depend on the machine and its load). Everything it made (containers, children, mounts) is removed at the end.
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
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "bench"))
sys.path.insert(0, str(REPO))

GIB = 1 << 30
N_FILES = 16  # as bench_shm_inspect: files 0..11 held by the children, 12..15 orphans

GOALS = {  # method -> (reference method, at most this many times it)
    "reconciler --help": ("docker ps -a", 6.0),
    "reconciler plan --json": ("docker ps -a", 12.0),
    "reconciler apply --yes (converged)": ("docker ps -a", 16.0),
    "loop: reconciler plan --json": ("docker ps -a", 6.0),
    "loop: reconciler status --json": ("docker ps -a", 6.0),
    "loop: reconciler apply --yes (converged)": ("docker ps -a", 8.0),
    "reconciler shm status": ("fuser -v FILES", 0.6),
    "reconciler shm status --json": ("fuser -v FILES", 0.6),
    "loop: reconciler shm status --json": ("fuser -v FILES", 0.5),
}
ALONE = {"RECONCILER_NO_LOOP": "1"}
FLOOR_GOAL = 2.0  # shm status at most this many times the maps floor


# The busy host's processes are forked by a small helper (stdlib only, like a serving worker's interpreter), not by
# this benchmark: a child inherits its parent's mappings, and this process has the Docker SDK and more loaded,
# which would make every child's maps several times longer than a real worker's.
HOLDERS = r"""
import sys
sys.path.insert(0, sys.argv[1])
from bench_shm_inspect import Children
children = Children(sys.argv[3:], int(sys.argv[2]))
print("ready", flush=True)
sys.stdin.read()
children.release()
"""


class Holders:
    def __init__(self, files: list[str], n: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", HOLDERS, str(REPO / "tests" / "bench"), str(n), *files],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the holder processes did not start")

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def trivial_recipe(port: int, shm: Path) -> dict:  # type: ignore[type-arg]
    """A container that is up as soon as the engine says so: fake-vllm, health only, no offload, no probes."""
    return {
        "description": "bench: a trivial container (fake vLLM, health only)",
        "tensor_parallel_size": 1,
        "model": {"id": "bench/trivial"},
        "container": {
            "image": "reconciler/fake-vllm:latest",
            "command": ["vllm", "serve", "bench/trivial", "--tensor-parallel-size", "1", "--port", str(port)],
            "volumes": ["/usr:/usr:ro"],
            "ipc": "host",
            "network": "host",
            "init": True,
        },
        "health": {"settle_s": 0, "start_timeout_s": 30},
        "stop": {"timeout_s": 5},
    }


def timed(
    cmd: list[str] | str, env: dict[str, str] | None = None, *, shell: bool = False, ok: tuple[int, ...] = (0,)
) -> tuple[float, str]:
    """Wall time of a whole process and its output (stdout and stderr in one pipe, as fuser -v needs)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        cmd, shell=shell, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    dt = time.perf_counter() - t0
    if p.returncode not in ok:
        raise SystemExit(f"{cmd} exited {p.returncode}:\n{p.stdout[-2000:]}")
    return dt, p.stdout


def same_output(a: str, b: str) -> str | None:
    """None when two outputs are the same apart from times; else the first line that differs."""
    import re

    times = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z?|\"(seconds|at|age_s|last_pass_age_s)\": [0-9.e+-]+")
    la, lb = times.sub("T", a).splitlines(), times.sub("T", b).splitlines()
    for x, y in zip(la, lb, strict=False):
        if x != y:
            return f"{x!r} != {y!r}"
    return None if len(la) == len(lb) else f"{len(la)} lines != {len(lb)} lines"


def rounds(methods: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(n):
        for name, go in methods.items():
            times[name].append(go())
    return times


def table(times: dict[str, list[float]], refs: dict[str, float], floor: float | None = None) -> list[str]:
    lines = []
    for m, ts in times.items():
        med = statistics.median(ts)
        goal = GOALS.get(m)
        cells = f"{m:40} {med * 1000:9.1f} {min(ts) * 1000:8.1f} {max(ts) * 1000:8.1f}"
        if goal:
            ref, limit = goal
            ratio = med / refs[ref]
            cells += f"   {ratio:6.2f}x {ref:<16} (goal <= {limit:g}x: {'met' if ratio <= limit else 'NOT met'})"
            if floor and "reconciler shm" in m:
                r = med / floor
                cells += f"; {r:5.2f}x floor (goal <= {FLOOR_GOAL:g}x: {'met' if r <= FLOOR_GOAL else 'NOT met'})"
        lines.append(cells)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--children", type=int, default=2000)
    ap.add_argument("--only", choices=("idle", "busy"), default=None, help="run one of the two settings")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark mounts a tmpfs")
    for tool in ("docker", "fuser"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing (apt-get install docker.io psmisc)")

    import docker
    from bench_shm_inspect import parse_fuser
    from e2e_helpers import LoopProcess, build_image, free_port, make_root

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "reconciler")], check=True, stdout=subprocess.DEVNULL
    )
    api = docker.APIClient(base_url="unix:///var/run/docker.sock", version="auto", timeout=60)
    build_image()
    work = Path(tempfile.mkdtemp(prefix="bench-commands-"))
    shm = work / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(work, shm=shm, api=api, name="bench-commands")
    env = {**root.env, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "reconciler", "--root", str(root.path)]
    root.write_recipe("trivial", trivial_recipe(free_port(), shm))
    root.manifest(("trivial", ["dark-compute-a"]))
    children = None
    loop = None
    out: list[str] = []
    alone_env = {**env, **ALONE}  # stand-alone beside a running loop
    try:
        timed([*cli, "apply", "--yes"], env)  # converged from here on
        n_containers = len(api.containers(all=True))
        print(
            f"host: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, {n_containers} containers in the engine",
            file=sys.stderr,
        )
        head = f"{'method (whole processes)':40} {'median':>9} {'min':>8} {'max':>8}   (ms)"
        if args.only in (None, "idle"):
            n_procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
            idle = {
                "docker ps -a": lambda: timed(["docker", "ps", "-a"])[0],
                "reconciler --help": lambda: timed([*cli, "--help"], env)[0],
                "reconciler plan --json": lambda: timed([*cli, "plan", "--json"], env)[0],
                "reconciler apply --yes (converged)": lambda: timed([*cli, "apply", "--yes"], env)[0],
            }
            times = rounds(idle, args.rounds)
            out += [
                (
                    f"idle host ({n_procs} processes, {n_containers} containers, one of them ours and converged), "
                    f"medians of {args.rounds} interleaved rounds"
                ),
                head,
            ]
            out += table(times, {"docker ps -a": statistics.median(times["docker ps -a"])})

        loop = LoopProcess(root, "--debounce", "1").started(timeout=60)
        if args.only in (None, "idle"):
            mismatches: list[str] = []

            def answered(*cmd: str, ok: tuple[int, ...] = (0,)) -> Callable[[], float]:
                def go() -> float:
                    dt, text = timed([*cli, *cmd], env, ok=ok)
                    if not checked.get(cmd):
                        checked[cmd] = True
                        alone = timed([*cli, *cmd], alone_env, ok=ok)[1]
                        if same_output(text, alone) is not None:
                            mismatches.append(f"{' '.join(cmd)}: {same_output(text, alone)}")
                    return dt

                return go

            checked: dict[tuple[str, ...], bool] = {}
            idle_loop = {
                "docker ps -a": lambda: timed(["docker", "ps", "-a"])[0],
                "loop: reconciler plan --json": answered("plan", "--json"),
                "loop: reconciler status --json": answered("status", "--json"),
                "loop: reconciler apply --yes (converged)": lambda: timed([*cli, "apply", "--yes"], env)[0],
            }
            times = rounds(idle_loop, args.rounds)
            out += ["", f"the same host with `reconciler run` running for it, medians of {args.rounds} rounds", head]
            out += table(times, {"docker ps -a": statistics.median(times["docker ps -a"])})
            out.append(
                "outputs answered by the loop: "
                + (
                    "identical to stand-alone (times aside)"
                    if not mismatches
                    else "DIFFERENT: " + "; ".join(mismatches)
                )
            )
            if mismatches:
                print("\n".join(out))
                return 1

        if args.only in (None, "busy"):
            files = [str(shm / f"vllm_offload_{i}.mmap") for i in range(N_FILES)]
            for f in files:
                with open(f, "wb") as fh:
                    fh.truncate(GIB)  # sparse: large mappings, no memory
            t0 = time.perf_counter()
            children = Holders(files, args.children)
            n_procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
            print(f"{args.children} children ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            verdicts: dict[str, object] = {}

            def fuser() -> float:
                dt, text = timed(["fuser", "-v", *files], ok=(0, 1))
                verdicts.setdefault("fuser", parse_fuser(text, files))
                return dt

            def ours_json(name: str, e: dict[str, str]) -> Callable[[], float]:
                def go() -> float:
                    dt, text = timed([*cli, "shm", "status", "--json"], e)
                    data = json.loads(text)
                    got: dict[str, set[int]] = {f: set() for f in files}
                    for f in data["files"]:
                        got[f["path"]] = {o["pid"] for o in f["owners"]}
                    verdicts.setdefault(name, {f: frozenset(p) for f, p in got.items()})
                    verdicts.setdefault("states", {f["path"]: f["state"] for f in data["files"]})
                    texts.setdefault(name, text)
                    return dt

                return go

            texts: dict[str, str] = {}

            busy = {
                "floor: cat /proc/[0-9]*/maps": lambda: timed(
                    "cat /proc/[0-9]*/maps >/dev/null 2>&1", shell=True, ok=(0, 1)
                )[0],
                "fuser -v FILES": fuser,
                "reconciler shm status": lambda: timed([*cli, "shm", "status"], alone_env)[0],
                "reconciler shm status --json": ours_json("ours", alone_env),
                "loop: reconciler shm status --json": ours_json("loop", env),
            }
            times = rounds(busy, args.rounds)
            same = verdicts["ours"] == verdicts["fuser"] == verdicts["loop"]
            diff = same_output(texts["loop"], texts["ours"])
            pairs = sum(len(p) for p in verdicts["fuser"].values())  # type: ignore[attr-defined]
            out += [
                "",
                (
                    f"busy host ({n_procs} processes; {args.children} children each hold 8 offload files open "
                    f"and map 4; {N_FILES} files, {pairs} (file, pid) pairs), medians of {args.rounds} rounds"
                ),
                head,
            ]
            out += table(
                times,
                {"fuser -v FILES": statistics.median(times["fuser -v FILES"])},
                floor=statistics.median(times["floor: cat /proc/[0-9]*/maps"]),
            )
            states = verdicts["states"]
            out.append(
                f"verdicts: shm status --json {'identical to' if same else 'DIFFERENT from'} fuser -v "
                f"(owners of all {N_FILES} files); states: "
                f"{sum(s == 'owned' for s in states.values())} owned, "  # type: ignore[attr-defined]
                f"{sum(s == 'orphan' for s in states.values())} orphan"
            )  # type: ignore[attr-defined]
            out.append(
                f"shm status --json answered by the loop: "
                f"{'identical to stand-alone' if diff is None else 'DIFFERENT: ' + diff}"
            )
            if not same or diff is not None:
                print("\n".join(out))
                return 1
    finally:
        if children is not None:
            children.release()
        if loop is not None:
            loop.stop()
        root.manifest()
        subprocess.run([*cli, "apply", "--yes"], env=env, capture_output=True, check=False)
        root.cleanup()
        subprocess.run(["umount", "-l", str(shm)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
