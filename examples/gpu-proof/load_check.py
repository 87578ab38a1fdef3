"""Free VRAM under load, on a real GPU: a probe suite runs against the fake vLLM while a real CUDA process takes the
card's memory, and the reserve judges the lowest free figure NVML reported meanwhile.

There is no Docker engine where the GPU proof runs, so no enter can be made. The fake vLLM runs as a plain process
(``examples/fake-vllm/fake_vllm.py``, every completion held ``slow-chat`` seconds so the suite takes a while) and this
script makes the call the apply layer makes once an enter's lane answers its health URL:
``reconciler.apply.serving.run_probes`` (the recipe's preflight suite, its card sampled by NVML five times a second),
then, on demand, ``run_suite`` of the
regression suite (what ``reconciler probe RECIPE --suite regression`` runs). The recipe is the demo's omni with its
report suites, served by the fake on this machine; the host is ``root/`` (NVML index 0, 3 GiB reserve, enforce).

Three runs, one JSON line each (also written to ``$OUT/load-check.jsonl`` when ``OUT`` is set):

1. ``idle``: the preflight with nothing else on the card: passes, the lowest figure far above the reserve;
2. ``preflight-under-load``: ``hold_gpu.py --leave-free-mib N`` starts as probe ``START_AT`` starts and holds until
   the suite ends: the enter's verdict under ``enforce`` must be a failed enter (``BelowReserve``) naming the card,
   the figure and the probe that was running when the lowest sample was taken;
3. ``regression-under-load``: the regression suite (a ~128K needle, a 20-request tool batch) while the holder,
   started just before it, keeps the card below the reserve: the verdict fails, naming the first probe.

Usage: load_check.py [--leave-free-mib 1024] [--slow 0.75]. Exit 0 when every run went as expected.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORK = Path("/tmp/reconciler-load-proof")


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"


def write_root(port: int) -> Path:
    """examples/gpu-proof/root, its recipe replaced by the demo's omni (with its suites) served by the fake here."""
    root = WORK / "root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(HERE / "root", root)
    demo = tomllib.loads((REPO / "examples/demo/configs/recipes/omni.toml").read_text())
    lines = [
        'description = "load proof: the demo omni recipe served by the fake vLLM as a plain process"',
        "tensor_parallel_size = 1",
        "[model]",
        'id = "gpu-proof/fake"',
        "[container]",
        'image = "never-started"',
        'command = ["sleep", "infinity"]',
        "[health]",
        f'url = "http://127.0.0.1:{port}/health"',
        "settle_s = 0",
        "start_timeout_s = 60",
    ]
    for p in demo["probes"]:
        lines.append("[[probes]]")
        tools = p.pop("tools", [])
        lines += [f"{k} = {toml_value(v)}" for k, v in p.items()]
        for t in tools:
            lines.append("[[probes.tools]]")
            lines += [f"{k} = {toml_value(v)}" for k, v in t.items()]
    (root / "configs/recipes/proof.toml").write_text("\n".join(lines) + "\n")
    return root


class Holder:
    """hold_gpu.py: a real CUDA process that takes all of GPU 0's free memory but N MiB, until stopped."""

    def __init__(self, leave_free_mib: int):
        self.leave = leave_free_mib
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = WORK / "hold.out"

    def start(self, *, wait: bool = False) -> None:
        if self.proc is None:
            self.out.write_text("")
            # HOLD_GPU: another holder, for a dry run of this script on a machine without a GPU.
            with open(self.out, "wb") as out:  # the child has its own copy of the descriptor
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        os.environ.get("HOLD_GPU", str(HERE / "hold_gpu.py")),
                        "--index",
                        "0",
                        "--leave-free-mib",
                        str(self.leave),
                        "--seconds",
                        "300",
                    ],
                    stdin=subprocess.PIPE,
                    stdout=out,
                )
        for _ in range(600 if wait else 0):
            if self.out.read_text().strip():
                return
            time.sleep(0.1)

    def stop(self) -> dict[str, Any]:
        held = {}
        if self.proc is not None:
            text = self.out.read_text().strip()
            held = json.loads(text.splitlines()[0]) if text else {"error": "the holder had not taken memory yet"}
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc = None
        return held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leave-free-mib", type=int, default=1024)
    ap.add_argument("--slow", type=float, default=0.75, help="seconds each completion of the fake takes")
    ap.add_argument("--start-at", default="structured-json", help="the preflight probe that starts the holder")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RECONCILER_STATE_DIR", str(WORK / "state"))
    os.environ.setdefault("RECONCILER_LOCK_DIR", str(WORK / "lock"))

    with open(WORK / "fake-vllm.log", "wb") as log:  # the child has its own copy of the descriptor
        fake = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "examples/fake-vllm/fake_vllm.py"),
                "serve",
                "gpu-proof/fake",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--fake-mode",
                f"slow-chat={args.slow:g}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    lines: list[dict[str, Any]] = []
    ok = True
    try:
        port = 0
        for _ in range(100):
            m = re.search(rb"Uvicorn running on http://[\d.]+:(\d+)", (WORK / "fake-vllm.log").read_bytes())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.1)
        root = write_root(port)

        from reconciler.apply.applier import Applier
        from reconciler.apply.errors import BelowReserve, ProbeFailed
        from reconciler.apply.probes import run_suite
        from reconciler.apply.serving import run_probes
        from reconciler.load.desired import load_desired
        from reconciler.model import container_name
        from reconciler.plan.actions import Action, ActionKind

        desired = load_desired(str(root))
        (lane,) = desired.assignments
        action = Action(
            kind=ActionKind.ENTER,
            reason="load proof",
            recipe=lane.recipe,
            gpus=lane.slots,
            container=container_name(lane.recipe, lane.slots),
            recipe_hash=lane.recipe_hash,
        )
        recipe = desired.recipes[lane.recipe]

        def enter_verdict(name: str, holder: Holder | None) -> dict[str, Any]:
            class Progress:
                def phase(self, action: Any, phase: str, **kw: Any) -> None:
                    if holder is not None and phase.startswith(f"probes: {args.start_at} "):
                        holder.start()

                def done(self, *a: Any) -> None:
                    return None

            applier = Applier(desired, connect=False, progress=Progress())
            applier.context.begin()  # this thread's figures, read back below
            out: dict[str, Any] = {"run": name, "policy": desired.reserve_policy(lane.recipe)}
            try:
                run_probes(applier.context, action, recipe)
                out["result"] = "passed"
            except BelowReserve as exc:
                out.update(result="failed: BelowReserve", cause=exc.cause)
            except ProbeFailed as exc:
                out.update(result="failed: ProbeFailed", cause=exc.cause)
            finally:
                out["held"] = holder.stop() if holder is not None else None
            out["probes"] = [(p["name"], p["ok"], p["seconds"]) for p in applier.context.figures().get("probes", [])]
            out["vram_under_load"] = applier.context.figures().get("vram_under_load")
            return out

        idle = enter_verdict("idle", None)
        lines.append(idle)
        ok &= idle["result"] == "passed" and not idle["vram_under_load"]["below"]

        loaded = enter_verdict("preflight-under-load", Holder(args.leave_free_mib))
        lines.append(loaded)
        low = (loaded["vram_under_load"] or {}).get("slots", {}).get("dark-compute-a", {})
        ok &= (
            loaded["result"] == "failed: BelowReserve"
            and "dark-compute-a" in loaded.get("cause", "")
            and f"probe {low.get('probe')!r}" in loaded.get("cause", "")
            and bool(low.get("probe"))
        )

        holder = Holder(args.leave_free_mib)
        holder.start(wait=True)
        run = run_suite(desired, lane.recipe, "regression", slots=lane.slots)
        held = holder.stop()
        reg = {
            "run": "regression-under-load",
            "ok": run.ok,
            "held": held,
            "probes": [(r.name, r.ok, round(r.seconds, 3), r.figures) for r in run.results],
            "vram_failed": run.vram.failed,
            "message": run.vram.message(),
            "vram_under_load": run.vram.to_json(),
        }
        lines.append(reg)
        ok &= run.vram.failed and all(r.ok for r in run.results)
    finally:
        fake.terminate()
        fake.wait(timeout=30)
    text = "\n".join(json.dumps(x) for x in lines)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "load-check.jsonl").write_text(text + "\n")
    print("LOAD PROOF OK" if ok else "LOAD PROOF FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
