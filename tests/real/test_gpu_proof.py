"""The GPU proof's scripts (examples/gpu-proof/, run on a real NVIDIA H200 by its run.sh) run here too, on this
machine's engine and a tmpfs, with NVML's answer simulated (tests/data/fake_nvml): they import, and the reserve
check gives its verdict under both policies, so a change of the apply layer's API fails here rather than on the
GPU host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROOF = REPO / "examples" / "gpu-proof"
FAKE_NVML = Path(__file__).parent.parent / "data" / "fake_nvml"
GIB = 1 << 30

pytestmark = [pytest.mark.docker]


def _root(tmp_path: Path, shm: Path, policy: str) -> Path:
    root = tmp_path / f"root-{policy}"
    shutil.copytree(PROOF / "root", root)
    host_file = root / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    demo = yaml.safe_load((REPO / "examples" / "demo" / "configs" / "host.yaml").read_text())
    doc["docker"]["url"] = demo["docker"]["url"]  # this machine's engine, not the proof's stand-in
    doc["docker"]["gpu_requests"] = False
    doc["shm"]["dir"] = str(shm)
    doc["gpu_reserve"]["policy"] = policy
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


@pytest.mark.parametrize(("policy", "expect"), [("enforce", "failed"), ("report", "stays")])
def test_the_reserve_check_gives_its_verdict_on_a_card_below_the_reserve(
    tmp_path: Path, tmpfs_dir: Path, docker_api: object, policy: str, expect: str
) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"devices": {"0": {"total": 80 * GIB, "used": 79 * GIB}}}))  # 1 GiB free, 3 kept
    env = {
        **os.environ,
        "FAKE_NVML_FILE": str(nvml),
        "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), str(REPO)]),
        "RECONCILER_STATE_DIR": str(tmp_path / "state"),
        "RECONCILER_LOCK_DIR": str(tmp_path / "lock"),
    }
    root = _root(tmp_path, tmpfs_dir, policy)
    r = subprocess.run(
        [sys.executable, str(PROOF / "reserve_check.py"), str(root), expect],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r
    out = json.loads(r.stdout)
    assert out["result"] == expect and out["policy"] == policy and out["gpu_source"] == "ok", out
    assert out["verdict"]["below"] == ["dark-compute-a"], out["verdict"]
