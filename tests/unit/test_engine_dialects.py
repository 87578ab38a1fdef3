"""Pure: what differs between engines, on captured answers. Which engine a version answer comes from, GPUs given
by CDI name read back from an inspect, and a rendered container as the body of Podman's own create."""

from __future__ import annotations

from reconciler.host.engine import podman
from reconciler.host.engine.protocol import (
    DOCKER,
    PODMAN,
    EngineDown,
    EngineError,
    EngineSlow,
    engine_kind,
    failure_cause,
)
from reconciler.model import HostConfig, Recipe
from reconciler.observe.containers import gpu_devices_of
from reconciler.plan import spec

# GET /version of Debian's Podman 4.3 API service and of Debian's docker.io 20.10 (trimmed to what is read).
PODMAN_VERSION = {
    "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}, {"Name": "Conmon"}],
    "Version": "4.3.1",
    "ApiVersion": "1.41",
}
DOCKER_VERSION = {
    "Components": [{"Name": "Engine", "Version": "20.10.24+dfsg1"}, {"Name": "containerd"}],
    "Version": "20.10.24+dfsg1",
    "ApiVersion": "1.41",
}
UUID = "GPU-5d3e8f0a-8c1e-4a57-9a8e-0c7d1f1a2b30"


def test_the_engine_is_told_by_its_version_answer() -> None:
    assert engine_kind(PODMAN_VERSION) == PODMAN
    assert engine_kind(DOCKER_VERSION) == DOCKER
    assert engine_kind({}) == DOCKER  # an answer without components speaks Docker's API as Docker does


def test_gpus_given_by_cdi_name_are_claims() -> None:
    by_device = {
        "HostConfig": {
            "Devices": [
                {"PathOnHost": f"nvidia.com/gpu={UUID}", "PathInContainer": "", "CgroupPermissions": "rwm"},
                {"PathOnHost": "/dev/fuse"},
            ]
        }
    }
    assert gpu_devices_of(by_device) == (UUID,)
    by_request = {
        "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0", "vendor.com/fpga=1"]}]}
    }
    assert gpu_devices_of(by_request) == ("0",)
    everything = {"HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]}}
    assert gpu_devices_of(everything) == ("all",)
    # A CDI spec's own NVIDIA_VISIBLE_DEVICES=void comes after the container's: the container's value still counts.
    podman = {"Config": {"Env": [f"NVIDIA_VISIBLE_DEVICES={UUID}", "NVIDIA_VISIBLE_DEVICES=void"]}}
    assert gpu_devices_of(podman) == (UUID,)


def test_failures_read_as_slow_down_or_error() -> None:
    assert failure_cause(EngineSlow("x", 1.0)) == "slow"
    assert failure_cause(EngineDown("x")) == "down"
    assert failure_cause(FileNotFoundError(2, "No such file or directory")) == "down"
    assert failure_cause(EngineError(403, "refused")) == "error"


def test_a_rendered_container_as_podmans_create_body() -> None:
    host = HostConfig(name="h", gpus={"a": {"uuid": UUID}}, gpu_telemetry="nvml", docker={"gpu_requests": True})
    recipe = Recipe.model_validate(
        {
            "tensor_parallel_size": 1,
            "model": {"id": "m"},
            "container": {
                "image": "img@sha256:" + "a" * 64,
                "command": ["vllm", "serve", "m"],
                "env": {"A": "1"},
                "volumes": ["/models:/models:ro", "/data:/data"],
                "ipc": "host",
                "network": "host",
                "init": True,
                "shm_size": "2g",
            },
        }
    )
    create = {**spec.render(host, recipe, ("a",)), "name": "reconciler-x-a", "labels": {"io.reconciler.host": "h"}}
    body = podman.libpod_create_body(create)
    assert body["devices"] == [{"path": f"nvidia.com/gpu={UUID}"}]
    assert body["name"] == "reconciler-x-a" and body["labels"] == {"io.reconciler.host": "h"}
    assert body["image"] == create["image"] and body["command"] == ["vllm", "serve", "m"]
    assert body["env"] == {"A": "1", "NVIDIA_VISIBLE_DEVICES": UUID}
    assert body["mounts"] == [
        {"type": "bind", "source": "/models", "destination": "/models", "options": ["ro"]},
        {"type": "bind", "source": "/data", "destination": "/data", "options": ["rw"]},
    ]
    assert body["ipcns"] == {"nsmode": "host"} and body["netns"] == {"nsmode": "host"}
    assert body["init"] is True and body["shm_size"] == 2 << 30 and body["restart_policy"] == "no"
    # A named network and another container's namespace.
    named = podman.libpod_create_body(
        {**create, "host_config": {**create["host_config"], "network_mode": "vllm-net", "ipc_mode": "container:other"}}
    )
    assert named["netns"] == {"nsmode": "bridge"} and named["networks"] == {"vllm-net": {}}
    assert named["ipcns"] == {"nsmode": "container", "value": "other"}


class _PublicOnly:
    """An SDK client whose private helpers are out of reach: only its public post(), base_url and timeout."""

    base_url = "http+docker://localhost"
    timeout = 7

    def __init__(self) -> None:
        self.posted: list[tuple[str, dict[str, object], object]] = []

    def post(self, url: str, *, json: dict[str, object], timeout: object) -> object:
        self.posted.append((url, json, timeout))

        class Answer:
            status_code = 201

            @staticmethod
            def json() -> dict[str, str]:
                return {"Id": "c0ffee"}

        return Answer()

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"Podman's create reached the SDK's {name}")


def test_podmans_create_with_gpus_uses_the_sdks_public_client_only() -> None:
    host = HostConfig(name="h", gpus={"a": {"uuid": UUID}}, gpu_telemetry="nvml", docker={"gpu_requests": True})
    recipe = Recipe.model_validate(
        {"tensor_parallel_size": 1, "model": {"id": "m"}, "container": {"image": "i:1", "command": ["vllm"]}}
    )
    create = {**spec.render(host, recipe, ("a",)), "name": "reconciler-x-a", "labels": {"io.reconciler.host": "h"}}
    sdk = _PublicOnly()
    engine = podman.PodmanEngine("unix:///run/podman/podman.sock", sdk=sdk)
    assert engine.create(create) == "c0ffee"
    ((url, body, timeout),) = sdk.posted
    assert url == "http+docker://localhost" + podman.LIBPOD_CREATE and timeout == 7
    assert body["devices"] == [{"path": f"nvidia.com/gpu={UUID}"}] and None not in body.values()
