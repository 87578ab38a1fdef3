"""The container a recipe becomes on its GPU slots, rendered as plain values, and its hash by part.

Pure. ``reconciler.apply.docker_ops.create_spec`` adds the name and labels and hands it to the engine; the planner
hashes the same rendering to decide whether a running container still matches: anything that would make a
different container (image, command, env, binds, GPU ids, device requests, host-level settings such as
``docker.gpu_requests``, or the recipe itself) changes the hash, and the part names say what changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from reconciler.model import HostConfig, Recipe

# The parts of a rendered container, in the order a "what changed" message lists them.
PARTS = ("image", "command", "env", "volumes", "gpus", "runtime", "recipe")

# Hash version 1 of the rendering (reconciler.model.recipe_hash): the keys ``render`` gave when lanes were first
# labelled, hashed as then. Never edit these; a setting rendered later goes to the runtime part, counted only where
# it differs from what it renders to at its default, which RENDER_LATER_DEFAULTS says (absent: None, left out).
RENDER_V1_TOP = frozenset({"image", "command", "entrypoint", "environment", "user", "host_config"})
RUNTIME_V1_HOST = frozenset({"ipc_mode", "network_mode", "init", "shm_size", "restart_policy"})
RENDER_LATER_DEFAULTS: Mapping[str, Any] = {}


def render(
    host: HostConfig, recipe: Recipe, slots: tuple[str, ...], *, secrets: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The create_container arguments for ``recipe`` on ``slots`` (no name, no labels). An env value ``"${NAME}"``
    becomes ``secrets[NAME]`` when given, and stays the reference otherwise."""
    spec = recipe.container
    gpus = [host.gpus[s].preferred_id() for s in slots]
    env = dict(spec.env)
    if secrets is not None:
        for key, var in spec.env_refs().items():
            env[key] = secrets[var]
    # The visible-devices env is set in every case, so the binding is readable even without a GPU runtime.
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
    binds = []
    for vol in spec.volumes:
        parts = vol.split(":")
        binds.append(vol if len(parts) == 3 else f"{vol}:rw")
    host_config: dict[str, Any] = {
        "binds": binds,
        "ipc_mode": spec.ipc,
        "network_mode": spec.network,
        "init": spec.init or None,
        "shm_size": spec.shm_size,
        "restart_policy": {"Name": "no"},  # restarts are this tool's decision (with backoff), not the engine's
    }
    if host.docker.gpu_requests:
        host_config["device_requests"] = [{"Driver": "nvidia", "DeviceIDs": gpus, "Capabilities": [["gpu"]]}]
    return {
        "image": spec.image,
        "command": list(spec.command) or None,
        "entrypoint": spec.entrypoint,
        "environment": env,
        "user": spec.user,
        "host_config": {k: v for k, v in host_config.items() if v is not None},
    }


# ---------------------------------------------------------------- Podman: GPUs by CDI name, through its own create
#
# Podman takes GPUs the way it documents them, as CDI device names (nvidia.com/gpu=<UUID or index>, from the spec
# `nvidia-ctk cdi generate` writes), not as Docker's DeviceRequest: its Docker-compatible create ignores that request
# without a word (measured on Debian's Podman 4.3: the container starts with no GPU), and takes CDI names only from
# 5.x on. So a container with GPUs is created on Podman through Podman's own create endpoint, with the same image,
# command, env, binds, namespaces and labels; the hash stays the engine-neutral rendering above (the same recipe on
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
    """Pure: the arguments ``reconciler.apply.docker_ops.create_spec`` makes (a rendered container with its name and
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


def _digest(value: Any, n: int) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:n]


def part_hashes(
    host: HostConfig, recipe: Recipe, slots: tuple[str, ...], *, secret_digests: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A short hash per part of the rendered container (see ``PARTS``). A secret env value counts by its digest
    (``secret_digests``, made by the loader): rotating it recreates the container, and no value is hashed here."""
    digests = secret_digests or {}
    r = render(
        host,
        recipe,
        slots,
        secrets={var: f"sha256:{digests.get(var, '?')}" for var in recipe.container.env_refs().values()},
    )
    return rendered_parts(r, recipe.content_hash())


def _runtime(r: Mapping[str, Any], later_defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime part: the host-level settings of hash version 1 as they were hashed then, and each setting
    rendered since (top-level or in host_config) only where it differs from what its default renders to."""
    hc = r["host_config"]
    out = {k: v for k, v in hc.items() if k in RUNTIME_V1_HOST} | {"user": r["user"]}
    later = {k: v for k, v in hc.items() if k not in RUNTIME_V1_HOST and k not in ("binds", "device_requests")}
    later |= {k: v for k, v in r.items() if k not in RENDER_V1_TOP}
    out.update({k: v for k, v in later.items() if v != later_defaults.get(k)})
    return out


def rendered_parts(
    r: Mapping[str, Any], recipe_hash: str, *, later_defaults: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Pure: the part hashes of a rendered container (``render``'s form, a secret as its digest) and its recipe's
    content hash. What a setting rendered after hash version 1 renders to at its default (``RENDER_LATER_DEFAULTS``,
    None when it is left out) moves no part: a release that adds one restarts no lane."""
    hc = r["host_config"]
    env = {k: v for k, v in r["environment"].items() if k != "NVIDIA_VISIBLE_DEVICES"}
    return {
        "image": _digest(r["image"], 8),
        "command": _digest([r["entrypoint"], r["command"]], 8),
        "env": _digest(env, 8),
        "volumes": _digest(hc.get("binds"), 8),
        "gpus": _digest([r["environment"]["NVIDIA_VISIBLE_DEVICES"], hc.get("device_requests")], 8),
        "runtime": _digest(_runtime(r, RENDER_LATER_DEFAULTS if later_defaults is None else later_defaults), 8),
        # What the recipe says beyond the container (model, offload, health, stop): editing it recreates too.
        "recipe": recipe_hash[:8],
    }


def encode_parts(parts: dict[str, str]) -> str:
    """The label value: ``image=ab12cd34,command=...`` in PARTS order."""
    return ",".join(f"{k}={parts[k]}" for k in PARTS if k in parts)


def decode_parts(label: str) -> dict[str, str]:
    out = {}
    for item in label.split(","):
        k, sep, v = item.partition("=")
        if sep:
            out[k] = v
    return out


def spec_hash(parts: dict[str, str]) -> str:
    """The one hash of a rendered container, from its part hashes (16 hex digits)."""
    return _digest(encode_parts(parts), 16)


def changed_parts(old_label: str, new: dict[str, str]) -> list[str]:
    """Pure: the names of the parts that differ between a container's parts label and the wanted parts."""
    old = decode_parts(old_label)
    return [k for k in PARTS if old.get(k) != new.get(k)]
