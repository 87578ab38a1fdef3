#!/usr/bin/env python3
"""Benchmark: what the front door (``reconciler door``) costs a streaming client, beside a lane asked directly and
beside HAProxy in plain HTTP mode (what any proxy costs), in one run (issue 42).

One fake vLLM lane (examples/fake-vllm/, streaming at ``--pace`` tokens per second per request) entered on the real
engine by ``reconciler apply``; HAProxy (``mode http``, one backend: the lane) and ``reconciler door`` each a whole
process of its own on loopback. The load is its own process too (``--client``): ``--clients`` (64) concurrent
streaming chat completions of ``--tokens`` tokens each, ``--per-client`` of them one after the other, through one
``aiohttp.ClientSession`` (see ``_load`` for why not httpx). Each round asks the three targets once each, in an order that turns every round (so machine
noise hits all alike); ``--rounds`` rounds.

Measured per target: the time to first byte of every request (from the request sent to the first byte of the body;
median and 99th percentile over every round's requests), the tokens per second the whole load received (the
median of the rounds), and for the two proxies the CPU their process spent per 1,000 tokens passed (from
/proc/PID/stat around each round: a figure that the machine's other load does not move, where the latencies and
the tokens per second on a busy machine measure the whole machine). The door's own count of requests it held is
printed too (none should be: the lane serves throughout). Each figure is printed beside its floor, the lane asked directly. Goals: the door adds at most
3 ms to the median time to first byte and 15 ms to the 99th percentile, and carries at least 90 % of the direct
tokens per second; reported met or not (they depend on the machine and its load). Every request must be answered
with its every token: otherwise the exit status is 1.

Run as root with a Docker engine: ``python3 tests/bench/bench_door.py [--rounds 5] [--clients 64]``. Everything it
made (the lane's container, the processes, the tmpfs) is removed at the end. On a machine without an engine,
``--lane process`` starts the recipe's fake vLLM as a plain process on the lane's port instead (the door reads only
the files and the lane's health URL, so it routes to it as to the container); ``HAPROXY`` names the binary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

GOAL_MEDIAN_MS = 3.0
GOAL_P99_MS = 15.0
GOAL_TOKENS = 0.90


# ---------------------------------------------------------------- the load (its own process)


async def _one(client: Any, url: str, body: bytes, ttfb: list[float]) -> int:
    t0 = time.perf_counter()
    tokens = 0
    first = True
    headers = {"Content-Type": "application/json"}
    async with client.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {(await resp.read())[:200]!r}")
        buf = b""
        async for chunk in resp.content.iter_any():
            if first:
                ttfb.append(time.perf_counter() - t0)
                first = False
            buf += chunk
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                data = ev.removeprefix(b"data: ")
                if data == b"[DONE]" or not data.strip():
                    continue
                choices = json.loads(data).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    tokens += 1
    return tokens


async def _load(url: str, model: str, clients: int, per_client: int, n_tokens: int) -> dict[str, Any]:
    """The load: ``clients`` streams at once through one aiohttp session (its HTTP parser is C, its pool hands a
    connection back as soon as its answer is read). Not httpx: with a pool as large as the clients, its requests
    waited up to 0.6 s for a connection to a target that keeps connections alive (the door), never for one that
    closes each (the fake lane, HAProxy before it), which halved the door's tokens per second in the load alone."""
    import aiohttp

    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": n_tokens}
    ).encode()
    ttfb: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def worker() -> int:
            return sum([await _one(client, url, body, ttfb) for _ in range(per_client)])

        await _one(client, url, body, [])  # one connection made before the clock starts
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(worker() for _ in range(clients)))
        seconds = time.perf_counter() - t0
    return {"ttfb": ttfb, "tokens": sum(counts), "seconds": seconds, "requests": clients * per_client}


# ---------------------------------------------------------------- the set-up


def _haproxy(cfg: Path, listen: int, lane: int) -> subprocess.Popen[bytes]:
    cfg.write_text(
        "global\n    maxconn 4096\n"
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n"
        f"frontend door\n    bind 127.0.0.1:{listen}\n    default_backend lane\n"
        f"backend lane\n    server lane 127.0.0.1:{lane}\n"
    )
    return subprocess.Popen(
        [os.environ.get("HAPROXY", "haproxy"), "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _haproxy_missing() -> str:
    """Why HAProxy cannot run here (``HAPROXY``, else ``haproxy`` on the PATH), or ""."""
    try:
        done = subprocess.run([os.environ.get("HAPROXY", "haproxy"), "-v"], capture_output=True, text=True, timeout=10)
    except OSError as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr or done.stdout).strip()[:300]


class _NoEngine:
    """``--lane process``: no engine to ask which GPU indexes other roots' lanes claim."""

    def containers(self) -> list[dict[str, Any]]:
        return []


def _lane_process(model: str, port: int, pace: float, log: Path) -> subprocess.Popen[bytes]:
    """The recipe's fake vLLM as a plain process on the lane's port (``--lane process``), as its container runs it."""
    fake = REPO / "examples" / "fake-vllm" / "fake_vllm.py"
    argv = [sys.executable, str(fake), "serve", model, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--fake-tokens-per-s", str(pace), "--max-num-seqs", "1024"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    _wait(f"http://127.0.0.1:{port}/health", lambda b: True, "the lane's process answers its health URL")
    return proc


def _wait(url: str, ok: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if ok(r.read()):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what}: not within {timeout:g} s")


def _cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) process ``pid`` has spent so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[98]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--per-client", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--pace", type=float, default=200.0, help="tokens per second of one request")
    ap.add_argument(
        "--lane",
        choices=("engine", "process"),
        default="engine",
        help="engine: the lane entered on the Docker engine by `reconciler apply` (the default); process: the fake "
        "vLLM started as a plain process on the lane's port (a machine without an engine: the door reads only the "
        "files and the lane's health, so it routes to it the same)",
    )
    ap.add_argument("--client", nargs=2, metavar=("URL", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        out = asyncio.run(_load(args.client[0], args.client[1], args.clients, args.per_client, args.tokens))
        print(json.dumps(out))
        return 0

    import yaml
    from e2e_helpers import free_port, make_root

    on_engine = args.lane == "engine"
    if on_engine:
        import docker

        api: Any = docker.APIClient(version="auto")
        subprocess.run([str(REPO / "examples" / "fake-vllm" / "build.sh")], check=True, capture_output=True)
    else:
        api = _NoEngine()
    base = Path(tempfile.mkdtemp(prefix="bench-door-"))
    shm = base / "shm" if on_engine else Path("/dev/shm")  # the door refuses a host whose shm.dir is no tmpfs
    if on_engine:
        shm.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm)], check=True)
    root = make_root(base, shm=shm, api=api, name="bench-door")
    procs: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}
    results: dict[str, list[dict[str, Any]]] = {"direct": [], "haproxy": [], "door": []}
    try:
        lane = root.recipe("omni", args=["--fake-tokens-per-s", str(args.pace), "--max-num-seqs", "1024"])
        data = root.recipe_data(lane)
        data["probes"] = []
        root.write_recipe(lane, data)
        model = data["model"]["id"]
        root.write_manifest_text(
            yaml.safe_dump({"host": root.host, "assignments": [{"recipe": lane, "gpus": ["dark-compute-a"]}]})
        )
        lane_port, proxy_port, door_port = root.port_of(lane), free_port(), free_port()
        if on_engine:
            applied = root.apply()
            if applied.rc != 0:
                raise SystemExit(f"the apply failed:\n{applied}")
        else:
            procs.append(_lane_process(model, lane_port, args.pace, base / "lane.log"))
        missing = _haproxy_missing()
        if missing:
            print(f"HAProxy not run (the proxy peer is left out): {missing}")
            del results["haproxy"]
        else:
            procs.append(_haproxy(base / "haproxy.cfg", proxy_port, lane_port))
            pids["haproxy"] = procs[-1].pid
        door_env = {**root.env, "PYTHONDONTWRITEBYTECODE": ""}
        procs.append(
            subprocess.Popen(
                root.cli_args("door", "--listen", f"127.0.0.1:{door_port}"),
                env=door_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
        _wait(
            f"http://127.0.0.1:{door_port}/v1/models",
            lambda b: any(m["reconciler"]["state"] == "serving" for m in json.loads(b)["data"]),
            "the door sees the lane serving",
        )
        pids["door"] = procs[-1].pid
        urls = {
            "direct": f"http://127.0.0.1:{lane_port}/v1/chat/completions",
            "haproxy": f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
            "door": f"http://127.0.0.1:{door_port}/v1/chat/completions",
        }
        if missing:
            del urls["haproxy"]
        else:
            _wait(f"http://127.0.0.1:{proxy_port}/health", lambda b: True, "HAProxy answers")
        order = list(urls)
        load = [sys.executable, __file__, "--clients", str(args.clients), "--per-client", str(args.per_client)]
        load += ["--tokens", str(args.tokens)]
        for r in range(args.rounds):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                cpu0 = _cpu_s(pids[name]) if name in pids else 0.0
                done = subprocess.run(
                    [*load, "--client", urls[name], model], capture_output=True, text=True, timeout=600, env=os.environ
                )
                if done.returncode != 0:
                    raise SystemExit(f"the load through {name} failed:\n{done.stderr[-2000:]}")
                results[name].append(
                    {**json.loads(done.stdout), "cpu": _cpu_s(pids[name]) - cpu0 if name in pids else 0}
                )
        with urllib.request.urlopen(f"http://127.0.0.1:{door_port}/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
        held = [ln for ln in lines if ln.startswith("reconciler_door_held_seconds_count")]
        print(f"requests the door held: {held[0].split()[-1] if held else '?'}")
        # Where the door's own time to first byte went: its wait for the lane's answer (the upstream histogram).
        first = [ln for ln in lines if ln.startswith("reconciler_door_upstream_first_byte_seconds_bucket")]
        print("the door's wait for the lane's headers (reconciler_door_upstream_first_byte_seconds), requests within:")
        buckets = [(re.search(r'le="([^"]+)"', ln), ln.split()[-1]) for ln in first]
        print("  " + ", ".join(f"{m.group(1)} s: {float(n):.0f}" for m, n in buckets if m))
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if on_engine:
            root.write_manifest_text(yaml.safe_dump({"host": root.host, "assignments": []}))
            root.apply()
            root.cleanup()
            subprocess.run(["umount", "-l", str(shm)], check=False)

    return report(results, args)


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> int:
    ok = True
    want = args.clients * args.per_client * args.tokens
    figures: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        ttfb = [x for r in runs for x in r["ttfb"]]
        for r in runs:
            if r["tokens"] != want or len(r["ttfb"]) != r["requests"]:
                print(f"{name}: {r['tokens']} tokens of {want}, {len(r['ttfb'])} first bytes of {r['requests']}")
                ok = False
        figures[name] = {
            "median": statistics.median(ttfb) * 1000,
            "p99": _p99(ttfb) * 1000,
            "tps": statistics.median(r["tokens"] / r["seconds"] for r in runs),
            "cpu": sum(r["cpu"] for r in runs) / sum(r["tokens"] for r in runs) * 1e6,
        }
    print(
        f"{args.clients} streaming clients x {args.per_client} requests of {args.tokens} tokens at {args.pace:g} "
        f"tokens/s each, {args.rounds} interleaved rounds"
    )
    floor = figures["direct"]
    print(
        f"{'target':<8} {'TTFB median':>12} {'(+floor)':>10} {'TTFB p99':>10} {'(+floor)':>10} {'tokens/s':>10} {'of floor':>9}"
        f" {'CPU ms/1k tokens':>17}"
    )
    for name, f in figures.items():
        print(
            f"{name:<8} {f['median']:>9.2f} ms {f['median'] - floor['median']:>+7.2f} ms {f['p99']:>7.2f} ms "
            f"{f['p99'] - floor['p99']:>+7.2f} ms {f['tps']:>10.0f} {f['tps'] / floor['tps']:>8.1%}"
            + (f" {f['cpu']:>17.1f}" if f["cpu"] else f" {'-':>17}")
        )
    door = figures["door"]
    checks = [
        (f"door adds <= {GOAL_MEDIAN_MS:g} ms to the median TTFB", door["median"] - floor["median"] <= GOAL_MEDIAN_MS),
        (f"door adds <= {GOAL_P99_MS:g} ms to the p99 TTFB", door["p99"] - floor["p99"] <= GOAL_P99_MS),
        (f"door carries >= {GOAL_TOKENS:.0%} of the direct tokens/s", door["tps"] >= GOAL_TOKENS * floor["tps"]),
    ]
    for what, met in checks:
        print(f"goal: {what}: {'met' if met else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
