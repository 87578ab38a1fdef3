"""Sleeping lanes on a real NVIDIA GPU: the planner's and the apply layer's rule 1 against real memory.

The vLLM stand-in (examples/fake-vllm) runs in CUDA mode with sleep mode on GPU 0: awake it holds ``AWAKE_MIB`` of real
GPU memory, asleep only ``RESIDUAL_MIB``. Its process stands for the container of a lane of this tool (no Docker on
the machines this proof runs on: NVML's pid is attributed to that lane's container id here, where the engine's cgroup
would say it on a real host). Everything else is real: NVML's figures, the lane's own GET /is_sleeping answer, the
planner (``reconciler.plan.planner.plan``), the status JSON (``reconciler.service.status.status_data``) and the check
the apply layer makes right before a wake (``reconciler.apply.sleep.check_wake``). The steps:

1. awake, the lane holds AWAKE_MIB; asleep (POST /sleep), its residual; ``status`` shows that residual as the card's
   ``asleep_bytes``;
2. a real CUDA process (hold_gpu.py) takes the memory the lane gave back: the plan blocks the wake naming its pid,
   the apply layer's check refuses it naming its pid, and the wake is never called (no out-of-memory start);
3. released, the plan wakes the lane, the wake's check passes, POST /wake_up brings its AWAKE_MIB back.

  python3 examples/gpu-proof/sleep_proof.py [AWAKE_MIB [RESIDUAL_MIB]]     (defaults 40960 and 1024)

Needs PyTorch with CUDA, nvidia-ml-py and this package importable. Exits 0 when every step holds; prints the figures.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from reconciler.apply.errors import ActionRefused  # noqa: E402
from reconciler.apply.sleep import check_wake  # noqa: E402
from reconciler.load.desired import standby_lanes  # noqa: E402
from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe  # noqa: E402
from reconciler.observe.gpu import observe_gpus  # noqa: E402
from reconciler.observe.lane_sleep import ask_sleeping  # noqa: E402
from reconciler.plan import spec  # noqa: E402
from reconciler.plan.actions import ActionKind  # noqa: E402
from reconciler.plan.observed import (  # noqa: E402
    LABEL_HOST,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_RECIPE_HASH,
    LABEL_SLOTS,
    LABEL_SPEC_HASH,
    LABEL_SPEC_PARTS,
    ContainerView,
    LaneMemory,
    Observed,
    Ownership,
    Reading,
    ShmView,
    Tmpfs,
    observation,
)
from reconciler.plan.planner import plan  # noqa: E402
from reconciler.service.status import status_data  # noqa: E402

FAKE = REPO / "examples" / "fake-vllm" / "fake_vllm.py"
SLOT = "dark-compute-a"
INSTALL = "5" * 32
CID = "5" * 64
MIB = 1 << 20


def desired_state(port: int) -> DesiredState:
    host = HostConfig.model_validate(yaml.safe_load((HERE / "root" / "configs" / "host.yaml").read_text()))
    lane = Recipe.model_validate(
        {
            "tensor_parallel_size": 1,
            "model": {"id": "fake/cuda"},
            "container": {
                "image": "gpu-proof:never-started",
                "command": ["vllm", "serve", "fake/cuda", "--enable-sleep-mode", "--port", str(port)],
                "env": {"VLLM_SERVER_DEV_MODE": "1"},
            },
            "health": {"url": f"http://127.0.0.1:{port}/health"},
            "sleep": {"level": 1, "timeout_s": 60},
        }
    )
    serve = (DesiredAssignment("lane", (SLOT,), lane.content_hash(), 0),)
    # The lane's topology runs and is on standby: the lane sleeps only when another runs; asleep now, it is woken.
    return DesiredState(
        host=host,
        recipes={"lane": lane},
        assignments=serve,
        topology="serve",
        topologies={"serve": serve},
        standby_topologies=("serve",),
        standby=standby_lanes(serve, []),
    )


def observed_now(desired: DesiredState, lane_pid: int, port: int, memory: LaneMemory | None) -> Observed:
    """NVML read now (the lane's pid attributed to its container) and the lane's own sleep answer."""
    recipe = desired.recipes["lane"]
    parts = spec.part_hashes(desired.host, recipe, (SLOT,))
    c = ContainerView(
        id=CID,
        name="reconciler-lane-dark-compute-a",
        state="running",
        image=recipe.container.image,
        labels={
            LABEL_MANAGED: "true",
            LABEL_HOST: desired.host.name,
            LABEL_INSTALL: INSTALL,
            LABEL_RECIPE: "lane",
            LABEL_RECIPE_HASH: recipe.content_hash(),
            LABEL_SPEC_HASH: spec.spec_hash(parts),
            LABEL_SPEC_PARTS: spec.encode_parts(parts),
            LABEL_SLOTS: SLOT,
        },
        gpu_devices=("0",),
    )
    gpus = observe_gpus(desired.host, container_of=lambda pid: CID if pid == lane_pid else None)
    answer = ask_sleeping(f"http://127.0.0.1:{port}")
    ok = Reading("docker", True)
    return observation(
        desired.host.name,
        containers=(c,),
        gpus=gpus,
        shm=ShmView(
            dir="/dev/shm", pattern="vllm_offload_*.mmap", tmpfs=Tmpfs(1 << 30, 0, 1 << 30), proc=ok, docker=ok
        ),
        docker=ok,
        ownership=Ownership(install_id=INSTALL, created=frozenset({CID}), healthy=frozenset({CID})),
        sleeping={CID: answer} if isinstance(answer, bool) else {},
        lane_memory={CID: memory} if memory else {},
    )


def lane_bytes(observed: Observed) -> int:
    view = observed.gpus.slots[SLOT]
    return sum(p.used_bytes or 0 for p in view.processes if p.container_id == CID)


def post(port: int, path: str) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - loopback HTTP only
        assert resp.status == 200, resp.status


def main() -> int:
    awake = int(sys.argv[1]) if len(sys.argv) > 1 else 40960
    residual = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    log = Path(tempfile.mkdtemp()) / "fake.log"
    with open(log, "wb") as out:
        lane = subprocess.Popen(
            [sys.executable, str(FAKE), "serve", "fake/cuda", "--enable-sleep-mode", "--port", "0", "--host",
             "127.0.0.1", "--fake-cuda-mib", str(awake), "--fake-cuda-residual-mib", str(residual)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"},
        )  # fmt: skip
    checks: list[tuple[str, bool]] = []
    figures: dict[str, Any] = {"asked": {"awake_mib": awake, "residual_mib": residual}}
    hog = None
    try:
        deadline = time.monotonic() + 180
        while not (m := re.search(r"CUDA mode: .*\(pid (\d+)\)", log.read_text())):
            if time.monotonic() > deadline or lane.poll() is not None:
                print(log.read_text())
                return 1
            time.sleep(0.2)
        port = int(re.search(r"Uvicorn running on http://[\d.]+:(\d+)", log.read_text()).group(1))  # type: ignore[union-attr]
        pid = int(m.group(1))
        desired = desired_state(port)

        now = observed_now(desired, pid, port, None)
        awake_b = lane_bytes(now)
        post(port, "/sleep?level=1")
        asleep = observed_now(desired, pid, port, None)
        asleep_b = lane_bytes(asleep)
        memory = LaneMemory(awake={SLOT: awake_b}, asleep={SLOT: asleep_b})
        asleep = replace(asleep, lane_memory={CID: memory})
        slot = status_data(desired, asleep, plan(desired, asleep))["slots"][SLOT]
        figures.update(
            awake_mib=awake_b // MIB, asleep_mib=asleep_b // MIB, status_asleep_mib=slot["asleep_bytes"] // MIB
        )
        checks += [
            ("awake, the lane holds what it was asked (NVML, by its pid)", awake_b >= awake * MIB),
            ("it says it sleeps (GET /is_sleeping)", asleep.sleeping.get(CID) is True),
            ("asleep, it holds its residual only", residual * MIB <= asleep_b < (residual + 2048) * MIB),
            ("status shows that residual as the card's asleep_bytes", slot["asleep_bytes"] == asleep_b),
        ]

        # A real CUDA process takes what the lane gave back, leaving less than the wake needs.
        hog = subprocess.Popen(
            [sys.executable, str(HERE / "hold_gpu.py"), "--index", "0", "--leave-free-mib", str(awake // 2)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        held = json.loads(hog.stdout.readline())  # type: ignore[union-attr]
        figures["hog"] = {"pid": held["pid"], "mib": held["bytes"] // MIB}
        blocked = replace(observed_now(desired, pid, port, None), lane_memory={CID: memory})
        p = plan(desired, blocked)
        named = [b for b in p.blockers if f"pid {held['pid']}" in b.reason]
        figures["blocked"] = [b.reason for b in p.blockers]
        checks.append(("the plan blocks the wake, naming the CUDA process's pid", bool(named) and not p.actions))
        try:
            check_wake(desired, blocked.containers[0], blocked)
            refused = ""
        except ActionRefused as exc:
            refused = exc.cause
        figures["refused"] = refused
        checks.append(
            ("the apply layer refuses the wake before any call, naming its pid", f"pid {held['pid']}" in refused)
        )
        checks.append(
            ("nothing woke it meanwhile (no out-of-memory start)", ask_sleeping(f"http://127.0.0.1:{port}") is True)
        )

        hog.stdin.close()  # type: ignore[union-attr]
        hog.wait(timeout=60)
        hog = None
        time.sleep(1)
        free = replace(observed_now(desired, pid, port, None), lane_memory={CID: memory})
        p = plan(desired, free)
        kinds = [a.kind for a in p.actions]
        checks.append(("released, the plan wakes the lane", kinds == [ActionKind.WAKE]))
        try:
            check_wake(desired, free.containers[0], free)
            passed = True
        except ActionRefused as exc:
            passed = False
            figures["refused_after"] = exc.cause
        checks.append(("and the apply layer's check lets it", passed))
        t0 = time.monotonic()
        post(port, "/wake_up")
        figures["wake_s"] = round(time.monotonic() - t0, 3)
        woken = observed_now(desired, pid, port, None)
        figures["woken_mib"] = lane_bytes(woken) // MIB
        checks.append(("woken, it holds its memory again", lane_bytes(woken) >= awake * MIB))
    finally:
        if hog is not None:
            hog.kill()
        lane.terminate()
        lane.wait(timeout=30)
    print(json.dumps(figures, indent=1))
    for what, ok in checks:
        print(("ok    " if ok else "FAIL  ") + what)
    good = all(ok for _, ok in checks) and len(checks) == 10
    print("SLEEP PROOF OK" if good else "SLEEP PROOF FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    threading.current_thread().name = "sleep-proof"
    raise SystemExit(main())
