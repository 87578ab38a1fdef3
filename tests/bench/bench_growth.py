#!/usr/bin/env python3
"""Benchmark: how the cost of ``shm status``, ``plan`` and one loop pass grows with the host (issue 14).

Three axes, each varied with the other two at their smallest:

- processes: 500 / 2,000 / 5,000 / 10,000 on the host (forked holders: each maps one offload file and holds
  another open, so the owner pairs grow with them);
- offload files: 10 / 100 / 1,000 in shm.dir (500 processes on the host, the holders among them spread over the
  files: at 1,000 most files are orphans);
- containers: 10 / 100 / 500 in the engine, one of them ours and running, the others not ours (a tenth running
  ``sleep``, the rest created), so every one is listed and inspected.

Measured at each point, medians of ``--runs``: ``reconciler shm status --json`` and ``reconciler plan --json`` as
whole processes, and one converged pass of the loop (``Loop.cycle`` with a warm engine cache, as each wake-up of
``reconciler run`` does) in a process of its own. Each curve's growth is judged by the cost per unit between its
first and last point, and by the log-log slope of its last two points: near 1 is linear, 2 quadratic.

Writes ``docs/performance.md``'s growth section (a table, the machine it ran on) and ``docs/performance-growth.png``
(matplotlib: a bench-only dependency, ``pip install matplotlib``; without it only the table is written).
Run as root with a Docker engine: ``python3 tests/bench/bench_growth.py [--runs 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
DOCS = REPO / "docs"
BEGIN, END = "<!-- growth:begin -->", "<!-- growth:end -->"

# Forks ``n`` holders from a small stdlib-only interpreter (a child inherits its parent's mappings: forking them
# from this process, with the Docker SDK loaded, would make every child's maps longer than a real worker's).
# The helper itself holds every file open, so none is an orphan: a loop pass would reclaim orphans, and the pass
# measured is a converged one.
HOLDERS = r"""
import ctypes, os, resource, signal, sys
n, files = int(sys.argv[1]), sys.argv[2:]

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
release_r, release_w = os.pipe()
ready_r, ready_w = os.pipe()
pids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the benchmark
            os.close(release_w); os.close(ready_r)
            held = os.open(files[i % len(files)], os.O_RDWR)
            fd = os.open(files[(i * 7 + 3) % len(files)], os.O_RDWR)
            libc.mmap(None, 1 << 20, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
            os.close(fd)
            os.write(ready_w, b".")
            os.read(release_r, 1)
        finally:
            os._exit(0)
    pids.append(pid)
os.close(release_r); os.close(ready_w)
got = 0
while got < n:
    chunk = os.read(ready_r, 65536)
    if not chunk:
        sys.exit(f"only {got} of {n} holders got ready")
    got += len(chunk)
# Opened after the forks: a child would inherit every one of them.
limit = len(files) + 256
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, max(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
keep = [os.open(f, os.O_RDWR) for f in files]
print("ready", flush=True)
sys.stdin.read()
os.close(release_w)
for pid in pids:
    os.waitpid(pid, 0)
"""

# One converged loop pass, in a process of its own: the first cycle warms the engine cache, the next are timed.
CYCLE = r"""
import json, os, sys, time
from reconciler.loop import Loop
from reconciler.loop.log import Log
loop = Loop(sys.argv[1], log=Log("json", open(os.devnull, "w")))
loop.cycle({"start"})
times = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    r = loop.cycle({"resync"})
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "result": r.result if r else None}))
"""


class Holders:
    def __init__(self, files: list[str], n: int):
        self.proc = None
        if not files:
            return
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", HOLDERS, str(n), *files],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {n} holder processes did not start")

    def release(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=300)
            self.proc = None


def timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0, 1, 2)) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    dt = time.perf_counter() - t0
    if p.returncode not in ok:
        raise SystemExit(f"{cmd} exited {p.returncode}: {p.stderr[-1500:]}")
    return dt


class Host:
    """A root of its own with one trivial container of ours running, and the means to grow each axis."""

    LABEL = "io.reconciler-bench.growth"

    def __init__(self, work: Path, api: object):
        from bench_commands import trivial_recipe
        from e2e_helpers import free_port, make_root

        self.api = api
        self.shm = work / "shm"
        self.shm.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(self.shm)], check=True)
        self.root = make_root(work, shm=self.shm, api=api, name="bench-growth")
        self.env = {**self.root.env, "PYTHONPATH": str(REPO)}
        self.cli = [sys.executable, "-m", "reconciler", "--root", str(self.root.path)]
        self.root.write_recipe("trivial", trivial_recipe(free_port(), self.shm))
        self.root.manifest(("trivial", ["dark-compute-a"]))
        timed([*self.cli, "apply", "--yes"], self.env, ok=(0,))
        self.files: list[str] = []
        self.others: list[str] = []

    def set_files(self, n: int) -> list[str]:
        for f in self.files[n:]:
            os.unlink(f)
        for i in range(len(self.files), n):
            p = str(self.shm / f"vllm_offload_growth-{i:05d}.mmap")
            with open(p, "wb") as fh:
                fh.truncate(1 << 20)  # sparse
            self.files.append(p)
        self.files = self.files[:n]
        return self.files

    def set_containers(self, n: int, image: str) -> None:
        """``n`` containers in the engine in all: ours, plus others (a tenth of them running)."""
        api = self.api
        want = max(0, n - 1)
        while len(self.others) > want:
            api.remove_container(self.others.pop(), force=True)  # type: ignore[attr-defined]
        while len(self.others) < want:
            cid = api.create_container(  # type: ignore[attr-defined]
                image,
                ["/usr/bin/sleep", "3600"],
                labels={self.LABEL: str(os.getpid())},
                host_config=api.create_host_config(binds=["/usr:/usr:ro"]),  # type: ignore[attr-defined]
            )["Id"]
            if len(self.others) % 10 == 0:
                api.start(cid)  # type: ignore[attr-defined]
            self.others.append(cid)

    def measure(self, runs: int) -> dict[str, float]:
        shm = [timed([*self.cli, "shm", "status", "--json"], self.env) for _ in range(runs)]
        plan = [timed([*self.cli, "plan", "--json"], self.env) for _ in range(runs)]
        p = subprocess.run(
            [sys.executable, "-c", CYCLE, str(self.root.path), str(runs)],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if p.returncode != 0:
            raise SystemExit(f"the loop pass driver failed: {p.stderr[-2000:]}")
        cyc = json.loads(p.stdout.strip().splitlines()[-1])
        return {
            "shm status": statistics.median(shm),
            "plan": statistics.median(plan),
            "loop pass": statistics.median(cyc["times"]),
        }

    def cleanup(self) -> None:
        self.root.manifest()
        subprocess.run([*self.cli, "apply", "--yes"], env=self.env, capture_output=True, check=False)
        self.set_containers(0, "")
        self.root.cleanup()
        subprocess.run(["umount", "-l", str(self.shm)], check=False)


def slope(points: list[tuple[int, float]]) -> float:
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return math.log(y1 / y0) / math.log(x1 / x0) if y0 > 0 and y1 > 0 and x1 != x0 else float("nan")


def verdict(points: list[tuple[int, float]]) -> str:
    s = slope(points)
    return "linear or better" if s <= 1.3 else ("superlinear" if s < 1.7 else "QUADRATIC")


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    docker = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB, Linux {platform.release()}, Python "
        f"{platform.python_version()}, Docker engine {docker}"
    )


def write_docs(results: dict[str, list[tuple[int, dict[str, float]]]], base_procs: int, stamp: str) -> None:
    units = {"processes": "processes", "files": "offload files", "containers": "containers"}
    intro = (
        f"Measured {stamp} on {machine()} by `tests/bench/bench_growth.py`; {base_procs} processes on "
        "the host before the benchmark's own. Medians, milliseconds; whole processes for `shm status --json` "
        "and `plan --json`, one converged pass for the loop (warm engine cache). Each axis is varied with the "
        "others at their smallest (500 processes, 10 files, 10 containers). The second table gives the log-log "
        "slope of each curve's last two points (1 linear, 2 quadratic)."
    )
    lines = [BEGIN, "", intro, ""]
    lines += ["| axis | size | shm status --json | plan --json | loop pass |", "| --- | ---: | ---: | ---: | ---: |"]
    for axis, pts in results.items():
        for n, m in pts:
            lines.append(
                f"| {units[axis]} | {n:,} | {m['shm status'] * 1000:.0f} | {m['plan'] * 1000:.0f} | "
                f"{m['loop pass'] * 1000:.0f} |"
            )
    lines += ["", "| axis | measure | slope of the last two points | growth |", "| --- | --- | ---: | --- |"]
    for axis, pts in results.items():
        for what in ("shm status", "plan", "loop pass"):
            series = [(n, m[what]) for n, m in pts]
            lines.append(f"| {units[axis]} | {what} | {slope(series):.2f} | {verdict(series)} |")
    plot = DOCS / "performance-growth.png"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for ax, (axis, pts) in zip(axes, results.items(), strict=True):
            xs = [n for n, _ in pts]
            for what in ("shm status", "plan", "loop pass"):
                ax.plot(xs, [m[what] * 1000 for _, m in pts], marker="o", label=what)
            ax.set_xlabel(units[axis])
            ax.set_ylabel("ms")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.suptitle(f"reconciler: cost by host size ({machine().split(',')[0]})")
        fig.tight_layout()
        fig.savefig(plot, dpi=90)
        lines += ["", "![cost by host size](performance-growth.png)"]
    except ImportError:
        lines += ["", "(no plot: matplotlib is not installed; `pip install matplotlib` and run again)"]
    lines += ["", END]
    doc = DOCS / "performance.md"
    text = doc.read_text() if doc.exists() else "# Performance\n\n## How cost grows\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN not in text:
        text += "\n## How cost grows\n\n" + BEGIN + "\n" + END + "\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(head + "\n".join(lines) + tail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, to try the script out")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark mounts a tmpfs")
    import docker
    from e2e_helpers import build_image

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "reconciler")], check=True, stdout=subprocess.DEVNULL
    )
    image = build_image()
    api = docker.APIClient(base_url="unix:///var/run/docker.sock", version="auto", timeout=120)
    procs = [500, 2000] if args.quick else [500, 2000, 5000, 10000]
    nfiles = [10, 100] if args.quick else [10, 100, 1000]
    ncont = [10, 50] if args.quick else [10, 100, 500]
    base = sum(1 for n in os.listdir("/proc") if n.isdigit())
    work = Path(tempfile.mkdtemp(prefix="bench-growth-"))
    host = Host(work, api)
    holders = Holders([], 0)
    results: dict[str, list[tuple[int, dict[str, float]]]] = {"processes": [], "files": [], "containers": []}
    try:
        host.set_containers(ncont[0], image)
        files = host.set_files(nfiles[0])
        for n in procs:
            holders.release()
            extra = max(0, n - sum(1 for p in os.listdir("/proc") if p.isdigit()))
            holders = Holders(files, extra)
            m = host.measure(args.runs)
            results["processes"].append((n, m))
            print(f"processes {n}: {m}", file=sys.stderr)
        holders.release()
        for n in nfiles:
            files = host.set_files(n)
            holders.release()
            # The host at its smallest process count, the holders spread over the files (at 1,000 files most
            # are orphans): only the files grow along this axis.
            holders = Holders(files, max(0, procs[0] - sum(1 for p in os.listdir("/proc") if p.isdigit())))
            m = host.measure(args.runs)
            results["files"].append((n, m))
            print(f"files {n}: {m}", file=sys.stderr)
        holders.release()
        holders = Holders(host.set_files(nfiles[0]), 0)
        for n in ncont:
            host.set_containers(n, image)
            m = host.measure(args.runs)
            results["containers"].append((n, m))
            print(f"containers {n}: {m}", file=sys.stderr)
    finally:
        holders.release()
        host.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    write_docs(results, base, time.strftime("%Y-%m-%d"))
    for axis, pts in results.items():
        for what in ("shm status", "plan", "loop pass"):
            series = [(n, m[what]) for n, m in pts]
            print(
                f"{axis:10} {what:10} "
                + "  ".join(f"{n}:{v * 1000:.0f}ms" for n, v in series)
                + f"  slope {slope(series):.2f} ({verdict(series)})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
