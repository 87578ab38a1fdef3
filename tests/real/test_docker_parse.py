"""Docker observation's pure parse, on engine answers as the engine writes them (list summary + inspect)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe.containers import (
    NVIDIA_MAJOR,
    PRIVILEGED,
    device_nodes,
    gpu_devices_of,
    offload_configured,
    parse_container,
)
from reconciler.plan.claims import id_kind


def inspect(env=(), cmd=(), entrypoint=None, device_requests=None, labels=None, args=()):  # type: ignore[no-untyped-def]
    return {
        "Name": "/x",
        "Args": list(args),
        "Config": {
            "Env": list(env),
            "Cmd": list(cmd),
            "Entrypoint": entrypoint,
            "Labels": labels or {},
            "Image": "img",
        },
        "HostConfig": {"DeviceRequests": device_requests},
    }


def test_device_request_with_ids() -> None:
    dr = [{"Driver": "", "Count": 0, "DeviceIDs": ["0", "GPU-3f2a"], "Capabilities": [["gpu"]], "Options": {}}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ("0", "GPU-3f2a")


def test_device_request_all_gpus() -> None:
    dr = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ("all",)


def test_device_request_count_takes_the_first_n() -> None:
    dr = [{"Driver": "nvidia", "Count": 2, "DeviceIDs": None, "Capabilities": [["gpu", "utility"]]}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ("0", "1")


def test_non_gpu_device_request_ignored() -> None:
    dr = [{"Driver": "other", "Count": -1, "DeviceIDs": None, "Capabilities": [["fpga"]]}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ()


def test_visible_devices_env_forms() -> None:
    assert gpu_devices_of(inspect(env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"])) == ("all",)
    assert gpu_devices_of(inspect(env=["NVIDIA_VISIBLE_DEVICES=1, GPU-abc"])) == ("1", "GPU-abc")
    for empty in ("none", "void", ""):
        assert gpu_devices_of(inspect(env=[f"NVIDIA_VISIBLE_DEVICES={empty}"])) == ()
    assert gpu_devices_of(inspect(env=["CUDA_VISIBLE_DEVICES=0"])) == ()


def test_request_and_env_are_merged_without_duplicates() -> None:
    dr = [{"Driver": "", "Count": 0, "DeviceIDs": ["1"], "Capabilities": [["gpu"]]}]
    assert gpu_devices_of(inspect(env=["NVIDIA_VISIBLE_DEVICES=1,0"], device_requests=dr)) == ("1", "0")


def test_offload_detection() -> None:
    assert offload_configured(inspect(cmd=["vllm", "serve", "m", "--kv-offloading-size", "8"]))
    assert offload_configured(inspect(cmd=["--kv-offloading-backend=native"]))
    assert offload_configured(inspect(entrypoint=["python", "-m", "vllm", "--kv-offloading-size", "1"]))
    assert offload_configured(inspect(args=["--kv-transfer-config", '{"kv_connector":"OffloadingConnector"}']))
    assert offload_configured(inspect(labels={"io.reconciler.offload": "true"}))
    assert offload_configured(inspect(env=["VLLM_KV_OFFLOAD_MMAP_PIN_MEMORY=0"]))
    assert not offload_configured(inspect(cmd=["vllm", "serve", "m", "--kv-offloading-sizes", "8"]))
    assert not offload_configured(inspect(labels={"io.reconciler.offload": "false"}, cmd=["vllm", "serve"]))


def test_parse_container_reads_state_exit_code_and_labels() -> None:
    summary = {
        "Id": "a" * 64,
        "Names": ["/reconciler-omni-dark-compute-b"],
        "Image": "reconciler/fake-vllm:latest",
        "State": "exited",
        "Status": "Exited (137) 3 seconds ago",
        "Labels": {
            "io.reconciler.managed": "true",
            "io.reconciler.slots": "dark-compute-b",
            "io.reconciler.recipe": "omni",
        },
    }
    c = parse_container(summary, inspect(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    assert c.name == "reconciler-omni-dark-compute-b" and c.state == "exited" and not c.active
    assert c.exit_code == 137 and c.managed and c.recipe == "omni" and c.slots == ("dark-compute-b",)
    assert c.gpu_devices == ("1",) and not c.preserved


# ---------------------------------------------------------------- cards given other than by a GPU request

DATA = Path(__file__).parent.parent / "data" / "docker"


def _captured(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def test_a_card_given_by_its_device_node_is_claimed_and_nvidiactl_is_no_card() -> None:
    # docker run --device NODES/nvidia3:/dev/nvidia3 --device NODES/ctl:/dev/nvidiactl, as the engine reports it.
    assert gpu_devices_of(_captured("device-node-and-nvidiactl.json")) == ("/dev/nvidia3",)


def test_a_card_node_is_known_by_its_device_number_whatever_its_names() -> None:
    raw = _captured("device-node-renamed.json")
    assert gpu_devices_of(raw) == ()  # the names alone tell nothing: /tmp/.../accel0 -> /dev/accel0
    assert device_nodes(raw["HostConfig"]["Devices"], stat=lambda path: _chr(0)) == []  # 0:0 is no card
    card = os.makedev(NVIDIA_MAJOR, 2)
    nodes = device_nodes(raw["HostConfig"]["Devices"], stat=lambda path: _chr(card))
    assert nodes == ["/dev/nvidia2"]
    assert gpu_devices_of({**raw, "DeviceNodes": nodes}) == ("/dev/nvidia2",)
    # nvidiactl (255), nvidia-modeset (254) and another driver's node (major 226, /dev/dri) are no cards.
    for other in (os.makedev(NVIDIA_MAJOR, 255), os.makedev(NVIDIA_MAJOR, 254), os.makedev(226, 0)):
        assert device_nodes(raw["HostConfig"]["Devices"], stat=lambda path, o=other: _chr(o)) == []


@pytest.mark.root
def test_device_nodes_reads_the_real_node_a_test_made(tmp_path: Path) -> None:
    node = tmp_path / "gpu-node"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, 5))
    (tmp_path / "plain").write_text("")
    devices = [{"PathOnHost": str(node)}, {"PathOnHost": str(tmp_path / "plain")}, {"PathOnHost": "/no/such"}]
    assert device_nodes(devices) == ["/dev/nvidia5"]


def _chr(rdev: int) -> os.stat_result:
    # st_rdev is the stat_result's field after the ten of the tuple form (and st_blksize, st_blocks).
    return os.stat_result((stat.S_IFCHR | 0o600, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": rdev})


def test_privileged_holds_every_card() -> None:
    raw = _captured("privileged.json")
    assert raw["HostConfig"]["Devices"] == []
    assert gpu_devices_of(raw) == (PRIVILEGED,)


def test_a_device_directory_holding_the_nodes_gives_every_card() -> None:
    raw = {"HostConfig": {"Devices": [{"PathOnHost": "/dev", "PathInContainer": "/dev"}]}}
    assert gpu_devices_of(raw) == ("all",)


def test_cdi_names_of_nvidia_devices() -> None:
    def devices(*names: str) -> dict[str, Any]:
        return {"HostConfig": {"Devices": [{"PathOnHost": n, "PathInContainer": n} for n in names]}}

    assert gpu_devices_of(devices("nvidia.com/gpu=0")) == ("0",)
    assert gpu_devices_of(devices("nvidia.com/gpu=all")) == ("all",)
    assert gpu_devices_of(devices("nvidia.com/gpu=GPU-3f2a")) == ("GPU-3f2a",)
    assert gpu_devices_of(devices("nvidia.com/gpu=1:0")) == ("1:0",)  # MIG device 0 of card 1
    # Another NVIDIA kind: kept as written, and the planner holds every slot for it.
    assert gpu_devices_of(devices("nvidia.com/mig=3")) == ("nvidia.com/mig=3",)
    cdi = [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0d"]}]
    assert gpu_devices_of(inspect(device_requests=cdi)) == ("MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0d",)


def test_mig_ids_are_kept_as_written() -> None:
    env = ["NVIDIA_VISIBLE_DEVICES=MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0d,0:1,MIG-GPU-5d3e8f0a/1/0"]
    assert gpu_devices_of(inspect(env=env)) == (
        "MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0d",
        "0:1",
        "MIG-GPU-5d3e8f0a/1/0",
    )


def test_each_kind_of_gpu_id() -> None:
    assert [id_kind(d) for d in ("0", "1:0", "GPU-ab", "MIG-GPU-ab12/1/0", "MIG-7a8b", "/dev/nvidia3", "foo")] == [
        "index",
        "index",
        "uuid",
        "uuid",
        "mig",
        "minor",
        "unknown",
    ]
