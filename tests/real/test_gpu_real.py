"""GPU telemetry against real NVML: a real CUDA process holds memory and the observer must find it.

Marked ``gpu``: these run where NVML answers with at least one GPU and PyTorch can use it, and are skipped
elsewhere with the reason. ``test_without_nvml_the_source_is_unavailable`` is the other half: it runs where
there is no NVML (CI, the build machines) and checks the real failure is reported, not raised.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from planner_fixtures import make_recipe

from reconciler.model import DesiredAssignment, DesiredState, HostConfig
from reconciler.observe.gpu import observe_gpus, read_nvml
from reconciler.plan.observed import GpuView, observation
from reconciler.plan.planner import plan

HOLDER = Path(__file__).resolve().parents[2] / "examples" / "gpu-proof" / "hold_gpu.py"
MIB = 1024**2
HOLD_MIB = 1024


def _probe() -> tuple[dict[str, Any], str]:
    """One real NVML read, and why the GPU tests cannot run here ('' when they can)."""
    raw = read_nvml(HostConfig(name="probe", gpus={"probe": {"index": 0}}))
    if raw["error"]:
        return raw, f"no NVML here: {raw['error']}"
    if not raw["device_count"]:
        return raw, "NVML answers but reports no GPU"
    if importlib.util.find_spec("torch") is None:
        return raw, "PyTorch is not installed: no way to start a CUDA process"
    return raw, ""


PROBE, NO_GPU = _probe()
needs_gpu = pytest.mark.skipif(bool(NO_GPU), reason=NO_GPU)


def host(slot: dict[str, Any]) -> HostConfig:
    return HostConfig(name="gpu-test", gpus={"dark-compute-a": slot}, gpu_telemetry="nvml")


@pytest.fixture(scope="module")
def holder() -> Iterator[dict[str, Any]]:
    """A real CUDA process holding HOLD_MIB on GPU 0, alive for the module's tests."""
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), "--index", "0", "--mib", str(HOLD_MIB), "--seconds", "300"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            proc.wait(timeout=30)
            pytest.fail(f"the CUDA holder exited ({proc.returncode}) before taking GPU memory")
        info = json.loads(line)
        assert info["pid"] == proc.pid
        yield {**info, "proc": proc}
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _until(check: Any, *, timeout: float = 15.0) -> GpuView:
    """Observe until ``check(view)`` holds: NVML lists a new context a moment after CUDA creates it."""
    deadline = time.monotonic() + timeout
    while True:
        view = observe_gpus(host({"index": 0}))
        if check(view) or time.monotonic() > deadline:
            return view
        time.sleep(0.2)


def _pids(view: GpuView) -> list[int]:
    return [p.pid for p in view.slots["dark-compute-a"].processes]


@pytest.mark.gpu
@needs_gpu
def test_the_cuda_process_is_on_its_slot_with_its_memory(holder: dict[str, Any]) -> None:
    view = _until(lambda v: holder["pid"] in _pids(v))
    assert view.reading.ok, view.reading.detail
    slot = view.slots["dark-compute-a"]
    assert slot.index == 0 and not slot.missing
    assert slot.uuid and slot.uuid.startswith("GPU-")
    assert "NVIDIA" in slot.name
    [p] = [p for p in slot.processes if p.pid == holder["pid"]]
    # What the process allocated, plus its CUDA context: never less than the allocation.
    assert p.used_bytes is not None and p.used_bytes >= HOLD_MIB * MIB
    assert p.container_id is None  # started straight on the host, not in a container
    assert str(HOLDER.name) in p.command
    assert slot.memory_total_bytes and slot.memory_used_bytes
    assert slot.memory_used_bytes >= p.used_bytes
    assert slot.memory_total_bytes > slot.memory_used_bytes


@pytest.mark.gpu
@needs_gpu
def test_a_slot_given_by_uuid_finds_the_same_gpu(holder: dict[str, Any]) -> None:
    uuid = PROBE["devices"][0]["uuid"]
    view = observe_gpus(host({"uuid": uuid}))
    assert view.reading.ok, view.reading.detail
    slot = view.slots["dark-compute-a"]
    assert (slot.index, slot.uuid) == (0, uuid)
    assert holder["pid"] in [p.pid for p in slot.processes]


@pytest.mark.gpu
@needs_gpu
def test_a_slot_past_the_last_gpu_is_missing() -> None:
    count = PROBE["device_count"]
    view = observe_gpus(host({"index": count}))
    assert view.reading.ok
    slot = view.slots["dark-compute-a"]
    assert slot.missing
    assert f"no GPU with index {count}; this host has {count} GPU(s)" in slot.error


@pytest.mark.gpu
@needs_gpu
def test_the_plan_for_that_slot_is_blocked_naming_the_pid(holder: dict[str, Any]) -> None:
    view = _until(lambda v: holder["pid"] in _pids(v))
    recipe = make_recipe()  # the planner cases' recipe: valid however strict the model grows
    desired = DesiredState(
        host=host({"index": 0}),
        recipes={"m": recipe},
        assignments=(DesiredAssignment("m", ("dark-compute-a",), recipe.content_hash(), 0),),
    )
    p = plan(desired, observation("gpu-test", gpus=view))
    assert p.blocked and not p.actions
    assert f"pid {holder['pid']}" in [b.holder for b in p.blockers]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gpu_requests", [True, False])
def test_two_slots_naming_one_card_block_every_enter(holder: dict[str, Any], gpu_requests: bool) -> None:
    # Card 0 named twice: by its UUID in one slot, by its index in the other. Each recipe would think it has
    # the card to itself; the real NVML answer shows it is one card, and the host file is refused until fixed.
    uuid = PROBE["devices"][0]["uuid"]
    a, b = "dark-compute-a", "dark-compute-b"
    two = HostConfig(
        name="gpu-test",
        gpus={a: {"uuid": uuid}, b: {"index": 0}},
        gpu_telemetry="nvml",
        docker={"gpu_requests": gpu_requests},
    )
    view = observe_gpus(two)
    assert not view.reading.ok
    assert (
        f"configs/host.yaml gpus: slots '{a}' (uuid {uuid}) and '{b}' (index 0) are one card, GPU 0 ({uuid})"
        in view.reading.detail
    ), view.reading.detail
    assert "give each slot its own card in configs/host.yaml" in view.reading.detail
    assert view.slots[a].index == view.slots[b].index == 0 and view.slots[a].uuid == view.slots[b].uuid == uuid
    for manifest in (((a,), (b,)), ((a, b),)):  # a recipe on each slot; one TP=2 lane on both
        recipe = make_recipe(tp=len(manifest[0]))
        desired = DesiredState(
            host=two,
            recipes={"m": recipe},
            assignments=tuple(DesiredAssignment("m", s, recipe.content_hash(), 0) for s in manifest),
        )
        p = plan(desired, observation("gpu-test", gpus=view))
        assert p.blocked and not p.actions, manifest
        assert p.unavailable == ("gpu",)
        for slots in manifest:  # each enter is blocked by the host error (the holder's pid blocks it too)
            assert any("are one card" in x.reason for x in p.blockers if x.gpus == slots), [
                x.reason for x in p.blockers
            ]


@pytest.mark.gpu
@needs_gpu
def test_the_process_is_gone_from_the_slot_once_it_exits(holder: dict[str, Any]) -> None:
    # Runs last in this module: it ends the shared holder.
    proc = holder["proc"]
    proc.stdin.close()
    proc.wait(timeout=30)
    view = _until(lambda v: holder["pid"] not in _pids(v))
    assert view.reading.ok
    assert holder["pid"] not in _pids(view)


@pytest.mark.skipif(not NO_GPU.startswith("no NVML here"), reason="NVML answers on this host; the gpu tests cover it")
def test_without_nvml_the_source_is_unavailable() -> None:
    view = observe_gpus(host({"index": 0}))
    assert view.telemetry == "nvml"
    assert not view.reading.ok
    assert view.reading.detail.startswith("NVML: NVMLError_")
    assert view.reading.detail.endswith("set 'gpu_telemetry: none' in configs/host.yaml")
    assert view.slots["dark-compute-a"].processes == ()
