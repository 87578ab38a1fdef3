"""An enter below the free-VRAM reserve, through the apply layer on a real engine.

No GPU here, so the GPU view is NVML's answer in WSL2's shapes (tests/data/nvml/, built from the binding's
documented values): both cards idle until the lane's container runs, then the lane's two workers (memory N/A, pids
of another namespace) with 2.1 GiB free per card. Everything else is real: the container is created, started,
passes its health check and settles, and then the reserve check decides. Under ``enforce`` the enter fails: the
container is kept stopped for its logs, the GPUs are freed, and the reason has the figures. Under ``report`` the
lane stays and the outcome says it is below the reserve."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from e2e_helpers import Root

from reconciler.apply.applier import Applier
from reconciler.load.desired import load_desired
from reconciler.observe.gpu import parse_nvml
from reconciler.plan.observed import LABEL_HOST

pytestmark = pytest.mark.docker

NVML = Path(__file__).parent.parent / "data" / "nvml"


def _at(raw: dict, root: Root) -> dict:
    index = [root.slot_index["dark-compute-a"], root.slot_index["dark-compute-b"]]
    raw["devices"] = [{**d, "index": index[d["index"]]} for d in raw["devices"]]
    raw["device_count"] = max(index) + 1
    return raw


def _applier(root: Root, policy: str, monkeypatch: pytest.MonkeyPatch) -> Applier:
    for key, value in root.env.items():
        monkeypatch.setenv(key, value)
    path = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["gpu_reserve"] = {"free_gib": 3.0, "policy": policy}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    desired = load_desired(str(root.path))
    applier = Applier(desired)
    real = applier.context.observe
    # The data's GPUs 0 and 1 become this root's GPU indexes (each test root draws its own, apart from others').
    idle = _at(json.loads((NVML / "wsl2-idle.json").read_text()), root)
    loaded = _at(json.loads((NVML / "wsl2-exclusive-below-reserve.json").read_text()), root)

    def observe():  # type: ignore[no-untyped-def]
        seen = real()
        lane = [c for c in seen.containers if c.active and c.labels.get(LABEL_HOST) == root.host and not c.preserved]
        if lane:
            gpus = parse_nvml(loaded, desired.host, container_of=lambda pid: lane[0].id, command_of=lambda pid: "")
        else:
            gpus = parse_nvml(idle, desired.host, container_of=lambda pid: None, command_of=lambda pid: "")
        return replace(seen, gpus=gpus)

    applier.context.observe = observe  # type: ignore[method-assign]  # every step observes through its context
    return applier


def test_enforce_fails_the_enter_and_keeps_the_container(root: Root, monkeypatch: pytest.MonkeyPatch) -> None:
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    res = _applier(root, "enforce", monkeypatch).converge()
    assert res.result == "failed", res.message
    (enter,) = res.outcomes
    assert enter.result == "failed"
    assert "below the free-VRAM reserve (gpu_reserve policy enforce)" in enter.detail
    assert "dark-compute-a: 2.10 GiB free of 95.59 GiB, below its 3.00 GiB reserve" in enter.detail
    assert "Kept as " in enter.detail
    assert enter.extra["gpu_reserve"]["failed"] is True
    running = [c for c in root.containers() if c["State"] == "running"]
    assert running == [], running  # the GPUs are free again
    kept = [c for c in root.containers() if "-failed-" in c["Names"][0]]
    assert len(kept) == 1 and kept[0]["State"] == "exited"


def test_report_keeps_the_lane_and_says_so(root: Root, monkeypatch: pytest.MonkeyPatch) -> None:
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    res = _applier(root, "report", monkeypatch).converge()
    assert res.result == "converged", res.message
    (enter,) = res.outcomes
    assert enter.result == "ok"
    assert "below its 3.00 GiB reserve" in enter.detail and "the lane stays" in enter.detail
    assert enter.extra["gpu_reserve"]["below"] == ["dark-compute-a", "dark-compute-b"]
    assert [c["State"] for c in root.containers() if "-failed-" not in c["Names"][0]] == ["running"]
