"""The qualification on a real NVIDIA GPU: per-card free VRAM sampled through a ladder, and the reserve gate that
refuses a promotion on what was sampled.

The vLLM stand-in (examples/fake-vllm) runs as a plain process (no Docker on the machines this proof runs on) in CUDA
mode on GPU 0: it holds ``CUDA_MIB`` of real GPU memory, and each request's prompt takes ``TOKEN_KIB`` KiB a token
more while it runs (its KV cache), at 6,000 tok/s prefill and 130 tok/s decode with 40 reasoning tokens first. The
run is the one ``reconciler qualify`` makes (``reconciler.service.qualify.one_run``: the preflight suite, the ladder
32000, 64000, 120000, NVML sampling every card of the lane throughout, naming the rung running) and its record is
built and kept as ``qualify`` builds and keeps it (``make_record``, ``store.evidence.keep``). Only the lane's
container is stood for: the stand-in's process is the lane. While the 120000 rung runs, a real CUDA process
(hold_gpu.py) takes all of the card's free memory but 1 GiB. Then:

1. the stand-in held its memory through the ladder (NVML, by its pid), and each rung's figures are within 10 % of the
   speeds it was set to, TTFO before first-visible TTFT;
2. the record names the card (slot, NVML index), its lowest free figure (below 3 GiB) and the rung it fell in
   (``rung 120000``);
3. a ``reserve_free_gib: 3`` gate, judged by ``reconciler.plan.gates.evaluate`` on the kept record, refuses the
   promotion, naming the card, its figure and the rung; the same gate at 0.5 GiB passes.

  python3 examples/gpu-proof/qualify_proof.py [CUDA_MIB [TOKEN_KIB]]     (defaults 4096 and 32)

Needs an NVIDIA driver, nvidia-ml-py, PyTorch with CUDA, and this package importable (the script puts the
repository first on its path). Prints the figures as JSON, then QUALIFY PROOF OK (exit 0) or QUALIFY PROOF FAILED
(exit 1) with why. Without NVML it fails at once, saying so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe  # noqa: E402

FAKE = REPO / "examples" / "fake-vllm" / "fake_vllm.py"
HOLD = HERE / "hold_gpu.py"
SLOT = "dark-compute-a"
LADDER = (32000, 64000, 120000)
PREFILL, DECODE = 6000, 130
MIB, GIB = 1 << 20, 1 << 30
HOLD_AFTER_QUERIED = 150_000  # prompt tokens looked up since the start: only the 120000 rung's lookup passes it


def fail(why: str) -> int:
    print(f"QUALIFY PROOF FAILED: {why}", flush=True)
    return 1


def nvml_card() -> dict[str, Any]:
    """GPU 0 as NVML names it; raises where NVML is missing or finds no GPU."""
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(h)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    return {
        "index": 0,
        "name": name.decode() if isinstance(name, bytes) else name,
        "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
        "total_bytes": int(mem.total),
        "free_bytes": int(mem.free),
    }


def held_by(pid: int) -> int:
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return sum(int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == pid)


def desired_state(port: int) -> DesiredState:
    host = HostConfig.model_validate(yaml.safe_load((HERE / "root" / "configs" / "host.yaml").read_text()))
    lane = Recipe.model_validate(
        {
            "tensor_parallel_size": 1,
            "model": {"id": "fake/cuda"},
            "container": {"image": "gpu-proof:plain-process", "command": ["vllm", "serve", "fake/cuda"]},
            "health": {"url": f"http://127.0.0.1:{port}/health"},
            "probes": [
                {"name": "models", "kind": "models"},
                {"name": "smoke", "prompt": "Reply with the single word: ready", "matches": "(?i)ready"},
            ],
        }
    )
    serve = (DesiredAssignment("lane", (SLOT,), lane.content_hash(), 0),)
    return DesiredState(host=host, recipes={"lane": lane}, assignments=serve)


def queried(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)$", text, re.M))


class Hold(threading.Thread):
    """Once the 120000 rung's prompt was looked up, a real CUDA process takes all free memory of GPU 0 but 1 GiB,
    until ``release``."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.start_q = port, queried(port)
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}
        self.error = ""
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while queried(self.port) - self.start_q < HOLD_AFTER_QUERIED:
                if self.done.is_set():
                    return
                time.sleep(0.1)
            self.proc = subprocess.Popen(
                [sys.executable, str(HOLD), "--index", "0", "--leave-free-mib", "1024", "--seconds", "300"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self.proc.stdout is not None
            self.info = json.loads(self.proc.stdout.readline() or "{}")
            self.info["taken_at"] = time.time()
        except Exception as exc:  # noqa: BLE001 - said in the proof's failure
            self.error = f"{type(exc).__name__}: {exc}"

    def release(self) -> None:
        self.done.set()
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)


def start_lane(cuda_mib: int, token_kib: int, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    with open(log, "wb") as out:
        lane = subprocess.Popen(
            [sys.executable, str(FAKE), "serve", "fake/cuda", "--port", "0", "--host", "127.0.0.1",
             "--fake-cuda-mib", str(cuda_mib), "--fake-cuda-token-kib", str(token_kib),
             "--fake-prefill-tok-s", str(PREFILL), "--fake-decode-tok-s", str(DECODE),
             "--fake-reasoning-tokens", "40"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 180
    while not (m := re.search(r"CUDA mode: .*\(pid (\d+)\)", log.read_text())):
        if time.monotonic() > deadline or lane.poll() is not None:
            raise RuntimeError(f"the stand-in did not start in CUDA mode:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    while not (p := re.search(r"Uvicorn running on http://[\d.]+:(\d+)", log.read_text())):
        if time.monotonic() > deadline or lane.poll() is not None:
            raise RuntimeError(f"the stand-in does not listen:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return lane, int(p.group(1)), int(m.group(1))


def checks_of(
    record: dict[str, Any], card: dict[str, Any], held: dict[str, int], cuda_mib: int
) -> list[tuple[str, bool]]:
    from reconciler.plan.gates import evaluate

    run = record["runs"][0]
    low = (run.get("vram") or {}).get(SLOT) or {}
    refused = evaluate([record], record["recipe_hash"], {"reserve_free_gib": 3})
    allowed = evaluate([record], record["recipe_hash"], {"reserve_free_gib": 0.5})
    rungs = run.get("ladder") or []
    want = f"reserve_free_gib: {SLOT} had "
    return [
        ("the run passed (preflight and every rung)", run["status"] == "passed"),
        ("the stand-in held its memory through the ladder (NVML, by its pid)", min(held.values()) >= cuda_mib * MIB),
        ("every rung's prefill within 10 % of 6,000 tok/s",
         all(abs((x.get("prefill_tok_s") or 0) - PREFILL) <= 0.1 * PREFILL for x in rungs) and len(rungs) == 3),
        ("every rung's decode within 10 % of 130 tok/s",
         all(abs((x.get("decode_tok_s") or 0) - DECODE) <= 0.1 * DECODE for x in rungs)),
        ("TTFO before first-visible TTFT on every rung", all(0 < x["ttfo_s"] < x["ttft_s"] for x in rungs)),
        ("the record names the card", record["cards"] == [{"slot": SLOT, "index": 0, "uuid": None}]),
        ("the card was sampled (no caveat 'per-card telemetry not sampled')", run.get("vram_sampled") is True),
        ("its lowest free figure is below 3 GiB", 0 < (low.get("min_free_bytes") or 0) < 3 * GIB),
        ("it fell during the 120000 rung", low.get("during") == "rung 120000"),
        ("reserve_free_gib: 3 refuses the promotion, naming the card, its figure and the rung",
         not refused.passed and any(f.startswith(want) and "during the 120000 rung; the gate is 3" in f
                                    for f in refused.failures)),
        ("reserve_free_gib: 0.5 lets it pass", allowed.passed),
        ("the card is the one NVML names", bool(card["uuid"])),
    ]  # fmt: skip


def main() -> int:
    cuda_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    token_kib = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    try:
        card = nvml_card()
    except Exception as exc:  # noqa: BLE001 - no NVML, no driver or no GPU: the proof cannot run here
        return fail(f"NVML is missing or finds no GPU ({type(exc).__name__}: {exc}); run it on a machine with an "
                    "NVIDIA GPU, its driver, nvidia-ml-py and PyTorch with CUDA")  # fmt: skip
    state = Path(tempfile.mkdtemp(prefix="qualify-proof-"))
    os.environ["RECONCILER_STATE_DIR"] = str(state / "state")  # the record is kept here, not in the host's state
    from reconciler.service.qualify import make_record, one_run
    from reconciler.store.evidence import keep, records

    lane = hold = None
    figures: dict[str, Any] = {"card": card, "asked": {"cuda_mib": cuda_mib, "token_kib": token_kib}}
    try:
        lane, port, pid = start_lane(cuda_mib, token_kib, state / "fake.log")
        desired = desired_state(port)
        held = {"before": held_by(pid)}
        hold = Hold(port)
        hold.start()
        run = one_run(desired, "lane", (SLOT,), ladder=LADDER, reload=False)
        held["after"] = held_by(pid)
        hold.release()
        if hold.error or not hold.info:
            return fail(f"the CUDA process that takes memory during a rung did not: {hold.error or 'no answer'}")
        record = make_record(desired, "lane", [run], containers=[f"pid {pid}"], digest=None, slots=(SLOT,),
                             ladder=LADDER, reload=False)  # fmt: skip
        path = keep(desired.host.name, record)
        kept = [r for r in records(desired.host.name, "lane") if r.get("file") == str(path)]
        figures.update(
            evidence=str(path),
            held_by_lane_mib={k: v // MIB for k, v in held.items()},
            hold=hold.info,
            ladder=[{k: x.get(k) for k in ("target_tokens", "prompt_tokens", "ttfo_s", "ttft_s", "prefill_tok_s",
                                           "decode_tok_s", "e2e_s")} for x in run["ladder"]],
            vram=run.get("vram"),
            caveats=record["caveats"],
        )  # fmt: skip
        from reconciler.plan.gates import evaluate

        figures["gate_reserve_free_gib_3"] = list(
            evaluate(kept, record["recipe_hash"], {"reserve_free_gib": 3}).failures
        )
        checks = checks_of(kept[0] if kept else record, card, held, cuda_mib)
    except Exception as exc:  # noqa: BLE001 - said, with the figures so far
        print(json.dumps(figures, indent=2, default=str))
        return fail(f"{type(exc).__name__}: {exc}")
    finally:
        if hold is not None:
            hold.release()
        if lane is not None:
            lane.terminate()
            lane.wait(timeout=30)
    print(json.dumps(figures, indent=2, default=str))
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    bad = [w for w, ok in checks if not ok]
    if bad:
        return fail("; ".join(bad))
    print("QUALIFY PROOF OK", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
