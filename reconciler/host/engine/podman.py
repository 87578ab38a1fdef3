"""Podman's engine (``protocol.Engine``): its Docker-compatible API service, as Docker's engine reaches it
(``reconciler.host.engine.docker``), but a container with GPUs is created through Podman's own create endpoint.

The create goes through the SDK's public client (``APIClient.post``, a requests session, on the client's own
``base_url`` and ``timeout``), never through its private helpers; an error answer becomes the protocol's error as
every other call's does. Chosen for an engine whose version answer names Podman (``reconciler.host.engine.connect``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reconciler.host.engine.docker import DockerEngine
from reconciler.host.engine.protocol import PODMAN

# Podman takes GPUs the way it documents them, as CDI device names (nvidia.com/gpu=<UUID or index>, from the spec
# `nvidia-ctk cdi generate` writes), not as Docker's DeviceRequest: its Docker-compatible create ignores that request
# without a word (measured on Debian's Podman 4.3: the container starts with no GPU), and takes CDI names only from
# 5.x on. So a container with GPUs is created on Podman through Podman's own create endpoint, with the same image,
# command, env, binds, namespaces and labels; the hash stays the engine-neutral rendering of ``reconciler.plan.spec`` (the same recipe on
# the same cards is the same container, whichever engine is told).

CDI_GPU_KIND = "nvidia.com/gpu"
LIBPOD_CREATE = "/v4.0.0/libpod/containers/create"  # the libpod API's path; 4.0 is the oldest version it needs
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def cdi_gpu_names(gpus: list[str] | tuple[str, ...]) -> list[str]:
    """Pure: the CDI device names of GPUs given by index or UUID."""
    return [f"{CDI_GPU_KIND}={g}" for g in gpus]


def _size_bytes(size: str | int) -> int:
    """``shm_size`` as the engine takes it (64m, 2g, 1073741824): bytes, by powers of 1024 as Docker counts them."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmg]?)b?", size.strip().lower())
    if m is None:
        raise ValueError(f"container.shm_size {size!r} is not a size")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def _namespace(mode: str | None) -> dict[str, str] | None:
    if mode is None:
        return None
    if mode.startswith("container:"):
        return {"nsmode": "container", "value": mode.split(":", 1)[1]}
    return {"nsmode": mode}


def libpod_create_body(create: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: the arguments ``reconciler.apply.engine_ops.create_spec`` makes (a rendered container with its name and
    labels) as the body of Podman's create (``LIBPOD_CREATE``), each GPU of its DeviceRequests a CDI device."""
    hc = create["host_config"]
    body: dict[str, Any] = {
        "name": create["name"],
        "image": create["image"],
        "labels": dict(create.get("labels") or {}),
        "env": dict(create.get("environment") or {}),
        "restart_policy": (hc.get("restart_policy") or {}).get("Name", "no"),
    }
    if create.get("command"):
        body["command"] = list(create["command"])
    if create.get("entrypoint") is not None:
        body["entrypoint"] = list(create["entrypoint"])
    if create.get("user"):
        body["user"] = create["user"]
    mounts = []
    for bind in hc.get("binds") or []:
        source, destination, mode = bind.split(":", 2)
        mounts.append({"type": "bind", "source": source, "destination": destination, "options": mode.split(",")})
    if mounts:
        body["mounts"] = mounts
    if (ipc := _namespace(hc.get("ipc_mode"))) is not None:
        body["ipcns"] = ipc
    network = hc.get("network_mode")
    if network is not None:
        if network in ("host", "none", "bridge", "private") or network.startswith("container:"):
            body["netns"] = _namespace(network)
        else:  # a network's name
            body["netns"] = {"nsmode": "bridge"}
            body["networks"] = {network: {}}
    if hc.get("init"):
        body["init"] = True
    if hc.get("shm_size") is not None:
        body["shm_size"] = _size_bytes(hc["shm_size"])
    devices: list[dict[str, str]] = []
    for req in hc.get("device_requests") or []:
        devices.extend({"path": name} for name in cdi_gpu_names(list(req.get("DeviceIDs") or [])))
    if devices:
        body["devices"] = devices
    return body


class PodmanEngine(DockerEngine):
    """Podman's Docker-compatible API service at ``url``; its create of a container with GPUs is its own."""

    kind = PODMAN

    def create(self, spec: Mapping[str, Any]) -> str:
        if not spec["host_config"].get("device_requests"):
            return super().create(spec)
        # What the engine would refuse to read as JSON: a null where it expects a value (the SDK leaves them out too).
        body = {k: v for k, v in libpod_create_body(spec).items() if v is not None}
        sdk = self.sdk
        with self.sdk_errors():
            res = sdk.post(f"{sdk.base_url}{LIBPOD_CREATE}", json=body, timeout=sdk.timeout)
            if res.status_code >= 400:
                _raise_answer(res)
            return str(res.json()["Id"])


def _raise_answer(res: Any) -> None:
    """The SDK's own error for an error answer (turned into the protocol's by ``sdk_errors``)."""
    import docker.errors  # sdk: this engine's create writes through it (start-up: imported by the writes only)
    import requests

    try:
        res.raise_for_status()
    except requests.HTTPError as exc:
        docker.errors.create_api_error_from_http_exception(exc)
