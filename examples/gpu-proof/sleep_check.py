"""The vLLM stand-in's CUDA mode on a real NVIDIA GPU: awake it holds ``--fake-cuda-mib`` of real GPU memory, asleep
only its residual, and waking takes the memory again; read from NVML per process (the pid's used memory), as the
reconciler reads a card. Exits 0 when every step holds; prints the figures.

  python3 examples/gpu-proof/sleep_check.py [AWAKE_MIB [RESIDUAL_MIB]]     (defaults 40960 and 1024)

Needs PyTorch with CUDA and nvidia-ml-py. Run by hand on a GPU machine (no Docker needed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pynvml

FAKE = Path(__file__).resolve().parents[1] / "fake-vllm" / "fake_vllm.py"
MIB = 1 << 20


def used_by(pid: int) -> int:
    """MiB of GPU 0 that ``pid`` holds, by NVML's compute-process list."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if p.pid == pid:
            return (p.usedGpuMemory or 0) // MIB
    return 0


def post(port: int, path: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - loopback HTTP only
        return resp.status


def main() -> int:
    awake = int(sys.argv[1]) if len(sys.argv) > 1 else 40960
    residual = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    pynvml.nvmlInit()
    log = Path(tempfile.mkdtemp()) / "fake.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(FAKE),
                "serve",
                "fake/cuda",
                "--enable-sleep-mode",
                "--port",
                "0",
                "--host",
                "127.0.0.1",
                "--fake-cuda-mib",
                str(awake),
                "--fake-cuda-residual-mib",
                str(residual),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"},
        )
    ok = True
    try:
        deadline = time.monotonic() + 120
        while not (m := re.search(r"CUDA mode: .*\(pid (\d+)\)", log.read_text())):
            if time.monotonic() > deadline or proc.poll() is not None:
                print(log.read_text())
                return 1
            time.sleep(0.2)
        port = int(re.search(r"Uvicorn running on http://[\d.]+:(\d+)", log.read_text()).group(1))  # type: ignore[union-attr]
        pid = int(m.group(1))
        figures = {"awake_mib": used_by(pid)}
        t0 = time.monotonic()
        post(port, "/sleep?level=1")
        figures["sleep_s"] = round(time.monotonic() - t0, 3)
        figures["asleep_mib"] = used_by(pid)
        t0 = time.monotonic()
        post(port, "/wake_up")
        figures["wake_s"] = round(time.monotonic() - t0, 3)
        figures["woken_mib"] = used_by(pid)
        print(json.dumps({"asked": {"awake_mib": awake, "residual_mib": residual}, **figures}))
        checks = [
            ("awake, it holds what it was asked", figures["awake_mib"] >= awake),
            (
                "asleep, it holds its residual and its CUDA context only",
                residual <= figures["asleep_mib"] < residual + 2048,
            ),
            ("woken, it holds it all again", figures["woken_mib"] >= awake),
        ]
        for what, held in checks:
            print(("ok    " if held else "FAIL  ") + what)
            ok = ok and held
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
