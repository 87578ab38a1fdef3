"""The files ``reconciler init`` writes, rendered from what it read of the machine (``observe.machine.Machine``):
``configs/host.yaml`` (each NVIDIA card by UUID, its index, name and memory in a comment; ``gpu_telemetry: none``
where NVML found none; WSL2's settings where the kernel is WSL2's; the engine found), an empty manifest, and a
commented recipe template beside the recipes (``.toml.example``: never loaded). Pure: values in, texts out; every
text it renders passes ``reconciler validate`` (tests/real/test_init.py).
"""

from __future__ import annotations

import math
import re

from reconciler.base.units import human_bytes
from reconciler.observe.machine import Machine

HOST_FILE = "configs/host.yaml"
RECIPE_TEMPLATE = "configs/recipes/TEMPLATE.toml.example"
MANIFEST_DIR = "manifests"


def host_name(hostname: str) -> str:
    """A host name the host file accepts, from the machine's (lower case, letters, digits and '-')."""
    name = re.sub(r"[^a-z0-9-]+", "-", hostname.split(".")[0].lower()).strip("-")
    return name[:63] or "gpu-host"


def files(machine: Machine, name: str) -> dict[str, str]:
    """Relative path -> text of every file ``init`` writes for a host called ``name``."""
    return {
        HOST_FILE: host_yaml(machine, name),
        f"{MANIFEST_DIR}/{name}.yaml": manifest_yaml(name),
        RECIPE_TEMPLATE: RECIPE_TEXT,
    }


def _gpus(machine: Machine) -> list[str]:
    if not machine.cards:
        why = machine.nvml or "NVML listed no card"
        return [
            f"# No NVIDIA card was found: {why}.",
            "# One slot by index, which gpu_telemetry none never asks about. On a GPU host, install the driver and",
            "# nvidia-ml-py and run `reconciler init` again.",
            "gpus:",
            "  gpu0: {index: 0}",
            "gpu_telemetry: none",
        ]
    lines = ["# Each card by UUID: an index changes when a card is added or moved."]
    if machine.driver:
        lines.append(f"# NVIDIA driver {machine.driver}.")
    lines.append("gpus:")
    for card in machine.cards:
        entry = f'  gpu{card.index}: {{uuid: "{card.uuid}"'
        if machine.wsl2:
            # Windows and its desktop hold VRAM NVML lists no process of: what the card holds now is its baseline.
            entry += f", idle_used_gib: {math.ceil(card.used_bytes / (1 << 30) + 0.5)}"
        entry += "}"
        lines.append(f"{entry:<60}  # index {card.index}: {card.name}, {human_bytes(card.memory_bytes)}")
    lines.append("gpu_telemetry: nvml")
    return lines


def _docker(machine: Machine) -> list[str]:
    if not machine.engines:
        tried = "; ".join(machine.engines_tried) or "nothing to try"
        return [
            f"# No container engine answered ({tried}): start Docker or Podman's service and set its socket here.",
            "docker:",
            "  url: unix:///var/run/docker.sock",
            f"  gpu_requests: {'true' if machine.cards else 'false'}",
        ]
    engine = machine.engines[0]
    lines = [f"# {engine.name} {engine.version}, found at {engine.url} ({engine.why})."]
    lines += [f"# Also answering: {e.name} {e.version} at {e.url}." for e in machine.engines[1:]]
    lines += [
        "docker:",
        f"  url: {engine.url}",
        f"  gpu_requests: {'true' if machine.cards else 'false'}"
        + ("          # needs the NVIDIA Container Toolkit (nvidia-ctk runtime configure)" if machine.cards else ""),
    ]
    return lines


def host_yaml(machine: Machine, name: str) -> str:
    shm = (
        f"# /dev/shm is {machine.shm_fs or 'of an unknown type'}"
        + (f", {human_bytes(machine.shm_bytes)}" if machine.shm_bytes is not None else "")
        + ": vLLM's native offload files go there."
    )
    lines = [
        "# Written by `reconciler init` from what it read of this machine; edit freely, then `reconciler validate`",
        "# (`reconciler schema host` prints the file's JSON Schema, for an editor).",
        f"name: {name}",
        *_gpus(machine),
        *_docker(machine),
        shm,
        "shm:",
        "  dir: /dev/shm",
        "  pattern: vllm_offload_*.mmap",
    ]
    if machine.wsl2:
        lines += [
            f"# WSL2 ({machine.wsl_why}): the VM's page cache holds memory Windows cannot take back; each leave",
            "# drops clean page cache. The cards' idle_used_gib above is what they held at init.",
            "page_cache:",
            "  drop_after_leave: true",
        ]
    lines += [
        "# Secrets (a recipe's \"${HF_TOKEN}\") come from the reconciler's environment, or a file of NAME=value",
        "# lines (root's, mode 0600) named here:",
        "# secrets:",
        "#   env_file: /etc/reconciler/secrets.env",
        "# Manifests and recipes from a git repository instead of this root's. Whoever can push to it chooses what",
        "# runs as root here: take only commits signed by the keys of allowed_signers, and bound what its recipes",
        "# may ask of this host in allow (by default: no host directory but shm.dir, not the host's network, no",
        "# secret; https:// or ssh:// only).",
        "# source:",
        "#   git: ssh://git@git.example.com/gpu/fleet.git",
        "#   path: fleet",
        '#   allowed_signers: /etc/reconciler/allowed_signers   # PRINCIPAL namespaces="git" ssh-ed25519 KEY',
        "#   allow:",
        "#     mounts: [/var/cache/huggingface]",
        "#     network_host: true",
        "#     env_from_secrets: [HF_TOKEN]",
    ]
    return "\n".join(lines) + "\n"


def manifest_yaml(name: str) -> str:
    return (
        "# Which recipe owns which GPU slot. Empty: nothing runs; add an assignment to start a lane, e.g.\n"
        "#   - recipe: qwen3-8b\n"
        "#     gpus: [gpu0]\n"
        f"host: {name}\n"
        "assignments: []\n"
    )


RECIPE_TEXT = """\
# A recipe template: copy it to NAME.toml in this directory and edit it (files ending .toml.example are never read).
# A stock vLLM image serving one model on one card. The tool never pulls an image: `docker pull` it first, and pin
# it by digest once it works (vllm/vllm-openai@sha256:...).
#
# description = "Qwen3 8B on one card, stock vLLM"
# tensor_parallel_size = 1
#
# [model]
# id = "Qwen/Qwen3-8B"
#
# [container]
# image = "vllm/vllm-openai:v0.11.0"
# command = ["Qwen/Qwen3-8B", "--tensor-parallel-size", "1", "--host", "127.0.0.1", "--port", "8000"]
# env = { HF_TOKEN = "${HF_TOKEN}" }          # a secret: from secrets.env_file or the environment
# volumes = ["/var/cache/huggingface:/root/.cache/huggingface"]
# ipc = "host"
# network = "host"
#
# [health]
# url = "http://127.0.0.1:8000/health"
# start_timeout_s = 900
#
# [[probes]]
# name = "smoke"
# prompt = "Reply with the single word: ready"
# matches = "(?i)ready"
"""
