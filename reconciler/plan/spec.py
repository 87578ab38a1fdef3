"""The container a recipe becomes on its GPU slots, rendered as plain values, and its hash by part.

Pure. ``reconciler.apply.engine_ops.create_spec`` adds the name and labels and hands it to the engine; the planner
hashes the same rendering to decide whether a running container still matches: anything that would make a
different container (image, command, env, binds, GPU ids, device requests, host-level settings such as
``docker.gpu_requests``, or the recipe itself) changes the hash, and the part names say what changed.
"""

from __future__ import annotations

import hashlib
import json
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
