#!/usr/bin/env python3
"""Benchmark: the shm guard's ownership inspection on a busy host, side by side with fuser, lsof and the floor.

Run as root: ``python tests/bench/bench_shm_inspect.py [--children 2000] [--runs 5]``.

It mounts a small tmpfs, creates sparse 1 GiB offload files on it, forks ``--children`` processes that each
hold 8 of them open and map 4 others (descriptor closed after the mapping, as a vLLM worker does), and leaves
4 files unheld. Then, in interleaved rounds so that machine noise hits every method alike, it times as whole
processes: a plain ``cat /proc/[0-9]*/maps`` (the floor: the kernel formatting every mapping once),
``fuser -v`` and ``lsof`` on the files, and ``python -m reconciler.observe.shm`` (with the default worker
count and with one process), and in-process ``inspect_shm``. It checks that the verdicts (which pids hold
each file) are identical to fuser's, prints medians and ratios, and always kills its children and unmounts.

Exit status: 0 when the verdicts match fuser's, 1 otherwise (the timing goals are reported, not enforced:
they depend on the machine's load).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
N_FILES = 16
N_HELD = 12  # files 12..15 are held by nobody: orphans
FDS_PER_CHILD = 8
MAPS_PER_CHILD = 4
PR_SET_PDEATHSIG = 1
PROT_READ, PROT_WRITE, MAP_SHARED = 1, 2, 1

Verdict = dict[str, frozenset[int]]


# ---------------------------------------------------------------- the busy host


class Children:
    """``n`` forked processes holding and mapping the files until the release pipe closes."""

    def __init__(self, files: list[str], n: int):
        self.pids: list[int] = []
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        release_r, self._release_w = os.pipe()
        ready_r, ready_w = os.pipe()
        for i in range(n):
            pid = os.fork()
            if pid == 0:  # the child: hold, map, report ready, wait for the release, exit without cleanup
                try:
                    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the benchmark
                    os.close(self._release_w)
                    os.close(ready_r)
                    held = [os.open(files[(i + k) % N_HELD], os.O_RDWR) for k in range(FDS_PER_CHILD)]
                    for k in range(MAPS_PER_CHILD):
                        fd = os.open(files[(i + FDS_PER_CHILD + k) % N_HELD], os.O_RDWR)
                        # libc's mmap, not Python's: Python's keeps a dup of the descriptor.
                        if libc.mmap(None, GIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) in (
                            None,
                            ctypes.c_void_p(-1).value,
                        ):
                            os._exit(2)
                        os.close(fd)
                    os.write(ready_w, b".")
                    os.close(ready_w)
                    del held
                    os.read(release_r, 1)
                finally:
                    os._exit(0)
            self.pids.append(pid)
        os.close(release_r)
        os.close(ready_w)
        got = 0
        while got < n:
            chunk = os.read(ready_r, n - got)
            if not chunk:
                raise RuntimeError(f"only {got} of {n} children got ready")
            got += len(chunk)
        os.close(ready_r)

    def release(self) -> None:
        if self._release_w >= 0:
            os.close(self._release_w)
            self._release_w = -1
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.pids = []


# ---------------------------------------------------------------- the methods and their verdicts


def parse_fuser(text: str, files: list[str]) -> Verdict:
    """fuser -v prints 'PATH:' then rows of 'USER PID ACCESS COMMAND' (the first on the PATH line)."""
    out: dict[str, set[int]] = {f: set() for f in files}
    current = None
    for line in text.splitlines():
        rest = line
        for f in files:
            if line.startswith(f + ":"):
                current, rest = f, line[len(f) + 1 :]
                break
        fields = rest.split()
        if current and len(fields) >= 3 and fields[1].isdigit():
            out[current].add(int(fields[1]))
    return {f: frozenset(p) for f, p in out.items()}


def parse_lsof(text: str, files: list[str]) -> Verdict:
    out: dict[str, set[int]] = {f: set() for f in files}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 9 and fields[1].isdigit() and fields[-1] in out:
            out[fields[-1]].add(int(fields[1]))
    return {f: frozenset(p) for f, p in out.items()}


def parse_ours(data: dict, files: list[str]) -> Verdict:  # type: ignore[type-arg]
    out: dict[str, set[int]] = {f: set() for f in files}
    for f in data["files"]:
        out[f["path"]] = {o["pid"] for o in f["owners"]}
    return {f: frozenset(p) for f, p in out.items()}


def run_whole(cmd: list[str] | str, *, shell: bool = False) -> tuple[float, str]:
    # One pipe for both streams: fuser -v writes each PID to stdout and the rest of its row to stderr.
    t = time.perf_counter()
    p = subprocess.run(cmd, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    return time.perf_counter() - t, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root: the benchmark mounts a tmpfs", file=sys.stderr)
        return 2
    for tool in ("fuser", "lsof"):
        if not shutil.which(tool):
            print(f"{tool} is missing: apt-get install psmisc lsof", file=sys.stderr)
            return 2

    work = Path(tempfile.mkdtemp(prefix="bench-shm-"))
    shm = work / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    children = None
    try:
        files = [str(shm / f"vllm_offload_{i}.mmap") for i in range(N_FILES)]
        for f in files:
            with open(f, "wb") as fh:
                fh.truncate(GIB)  # sparse: large mappings, no memory
        t0 = time.perf_counter()
        children = Children(files, args.children)
        n_procs = sum(1 for n in os.listdir("/proc") if n.isdigit())
        print(
            f"{args.children} children ready in {time.perf_counter() - t0:.1f} s; {n_procs} processes on the host; "
            f"each child holds {FDS_PER_CHILD} offload fds and maps {MAPS_PER_CHILD} files of 1 GiB; "
            f"{N_FILES - N_HELD} of {N_FILES} files are orphans; {os.cpu_count()} CPUs"
        )

        # Imported only now: the children were forked from a small process.
        sys.path.insert(0, str(REPO))
        from reconciler.observe.shapes import status_json
        from reconciler.observe.shm import inspect_shm
        from reconciler.plan.observed import Reading

        class Cfg:
            dir = str(shm)
            pattern = "vllm_offload_*.mmap"
            ignore_uninspectable_pids = (1,)  # unreadable even by root on these machines

        ok = Reading("docker", True)
        py = [sys.executable, "-m", "reconciler.observe.shm", "--dir", str(shm), "--ignore-pid", "1"]
        os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")

        def in_process(workers: int | None) -> Callable[[], tuple[float, Verdict]]:
            def go() -> tuple[float, Verdict]:
                t = time.perf_counter()
                view = inspect_shm(Cfg, containers=(), docker=ok, workers=workers)
                return time.perf_counter() - t, parse_ours(status_json(view), files)

            return go

        def whole(cmd: list[str] | str, parse: Callable[[str], Verdict] | None, shell: bool = False):  # type: ignore[no-untyped-def]
            def go() -> tuple[float, Verdict | None]:
                dt, out = run_whole(cmd, shell=shell)
                return dt, parse(out) if parse else None

            return go

        import json

        methods: dict[str, Callable[[], tuple[float, Verdict | None]]] = {
            "floor: cat /proc/[0-9]*/maps": whole("cat /proc/[0-9]*/maps >/dev/null 2>&1", None, shell=True),
            "fuser -v FILES": whole(["fuser", "-v", *files], lambda o: parse_fuser(o, files)),
            "lsof FILES": whole(["lsof", "-n", "-P", "-w", *files], lambda o: parse_lsof(o, files)),
            "ours, whole process (python -m)": whole(py, lambda o: parse_ours(json.loads(o), files)),
            "ours, whole process, 1 worker": whole([*py, "--workers", "1"], lambda o: parse_ours(json.loads(o), files)),
            "ours, in-process": in_process(None),
            "ours, in-process, 1 worker": in_process(1),
            "python -c 'import reconciler.observe.shm'": whole(
                [sys.executable, "-c", "import reconciler.observe.shm"], None
            ),
        }
        times: dict[str, list[float]] = {m: [] for m in methods}
        verdicts: dict[str, Verdict | None] = {}
        for _ in range(args.runs):
            for name, go in methods.items():
                dt, verdict = go()
                times[name].append(dt)
                verdicts.setdefault(name, verdict)

        med = {m: statistics.median(ts) for m, ts in times.items()}
        floor, fuser = med["floor: cat /proc/[0-9]*/maps"], med["fuser -v FILES"]
        print(f"\nmedians of {args.runs} interleaved runs (seconds)")
        print(f"{'method':44} {'median':>8} {'min':>7} {'max':>7} {'x floor':>8} {'x fuser':>8}")
        for m, ts in times.items():
            print(f"{m:44} {med[m]:8.3f} {min(ts):7.3f} {max(ts):7.3f} {med[m] / floor:8.2f} {med[m] / fuser:8.2f}")

        ref = verdicts["fuser -v FILES"]
        assert ref is not None
        held = sum(1 for p in ref.values() if p)
        print(
            f"\nfuser: {held} files held, {len(ref) - held} orphans, {sum(len(p) for p in ref.values())} (file, pid) pairs"
        )
        same = True
        for m in (
            "lsof FILES",
            "ours, whole process (python -m)",
            "ours, whole process, 1 worker",
            "ours, in-process",
            "ours, in-process, 1 worker",
        ):
            v = verdicts[m]
            match = v == ref
            if m.startswith("ours"):
                same &= match
            diff = "" if match else f"  (differs on {sum(1 for f in files if v and v[f] != ref[f])} files)"
            print(f"verdicts {m:40} {'identical to fuser' if match else 'DIFFERENT from fuser'}{diff}")

        ours = med["ours, whole process (python -m)"]
        print(
            f"\ngoal: at most half fuser's time -> whole process {ours / fuser:.2f} x fuser "
            f"({'met' if ours <= fuser / 2 else 'NOT met'}); in-process {med['ours, in-process'] / fuser:.2f} x fuser"
        )
        print(
            f"goal: within 2x of the floor -> whole process {ours / floor:.2f} x floor "
            f"({'met' if ours <= 2 * floor else 'NOT met'}); in-process {med['ours, in-process'] / floor:.2f} x floor"
        )
        return 0 if same else 1
    finally:
        if children is not None:
            children.release()
        subprocess.run(["umount", "-l", str(shm)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
