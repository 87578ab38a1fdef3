"""The root ``reconciler init --no-gpu`` writes: a host of two stand-in GPU slots and two recipes of the stand-in
vLLM image (``reconciler/fake-vllm:latest``, which ``make demo`` builds from examples/fake-vllm/), so a newcomer can
write, plan, apply and switch recipes of their own on a machine without a GPU before they touch a GPU box.

What makes a recipe run on that image, as the demo's do (examples/demo/configs): the host's ``/usr`` mounted
read-only (the image is a bare skeleton and runs the host's Python), ``health.settle_s`` short, a port of its own
on the host's network, and ``gpu_requests: false`` (a GPU-less engine has no NVIDIA runtime). Its slots and ports
keep clear of the demo's (GPU indexes 0 and 1, ports 8000 to 8013), so both can run side by side.

Pure: values in, texts out, like ``load.init_files``; ``service.init_root`` takes it for ``--no-gpu``. Every text passes ``reconciler validate``
(tests/real/test_init.py), and ``tests/real/test_init_no_gpu.py`` applies the root on the real engine.
"""

from __future__ import annotations

from reconciler.load.init_files import RECIPE_TEMPLATE, RECIPE_TEXT
from reconciler.observe.machine import Machine

STAND_IN_IMAGE = "reconciler/fake-vllm:latest"
STAND_IN_HOST = "try"
# slot -> GPU index: with gpu_telemetry none a slot is only an id its lane's container claims
# (NVIDIA_VISIBLE_DEVICES); 2 and 3 are not the demo's 0 and 1.
STAND_IN_SLOTS = {"stand-in-a": 2, "stand-in-b": 3}
# recipe -> (slot, port); distinct ports, none of the demo's.
STAND_IN_RECIPES = {"first": ("stand-in-a", 8101), "second": ("stand-in-b", 8102)}


def stand_in_host_yaml(machine: Machine, name: str) -> str:
    engine = machine.engines[0] if machine.engines else None
    found = (
        f"# {engine.name} {engine.version}, found at {engine.url} ({engine.why})."
        if engine
        else "# No container engine answered: start Docker or Podman's service and set its socket here."
    )
    slots = [f"  {slot}: {{index: {index}}}" for slot, index in STAND_IN_SLOTS.items()]
    return (
        "\n".join(
            [
                "# Written by `reconciler init --no-gpu`: a root for trying the tool on a machine without a GPU. Its",
                f"# recipes run the stand-in vLLM image {STAND_IN_IMAGE} (`make demo` builds it, or",
                "# examples/fake-vllm/build.sh alone): a small server that answers vLLM's API and the tool's probes, with",
                "# no model and no GPU. On a GPU host, `reconciler init` (without --no-gpu) names each card by UUID.",
                f"name: {name}",
                "# Two stand-in GPU slots. With gpu_telemetry none a slot is only an id its lane's container claims",
                "# (NVIDIA_VISIBLE_DEVICES): indexes 2 and 3 keep clear of the demo's 0 and 1, so both run side by side.",
                "gpus:",
                *slots,
                "gpu_telemetry: none",
                found,
                "docker:",
                f"  url: {engine.url if engine else 'unix:///var/run/docker.sock'}",
                "  gpu_requests: false        # a GPU-less engine has no NVIDIA runtime to ask for a card",
                "shm:",
                "  dir: /dev/shm",
                "  pattern: vllm_offload_*.mmap",
                "  # On some machines (a microVM's init, for one) even root cannot read pid 1's /proc/1/maps; pid 1 maps",
                "  # no offload file here. On a serving host, excuse no pid you have not checked.",
                "  ignore_uninspectable_pids: [1]",
            ]
        )
        + "\n"
    )


def stand_in_recipe(name: str, slot: str, port: int) -> str:
    return f"""\
# A recipe of the stand-in vLLM (`reconciler init --no-gpu`): edit it as you would a real one, and `reconciler plan`
# says what the edit changes. A real vLLM's recipe: configs/recipes/TEMPLATE.toml.example beside it.
description = "{name} (stand-in): one fake vLLM worker on {slot}"
tensor_parallel_size = 1

[model]
id = "try/{name}"

[container]
image = "{STAND_IN_IMAGE}"
command = ["vllm", "serve", "try/{name}", "--tensor-parallel-size", "1", "--port", "{port}"]
volumes = ["/usr:/usr:ro"]   # the stand-in image is a bare skeleton: the host's Python runs inside
ipc = "host"
network = "host"             # the host's network: each recipe a port of its own
init = true

[health]
url = "http://127.0.0.1:{port}/health"
settle_s = 0.5               # /health answers this long before the enter goes on to the probes
start_timeout_s = 30         # the stand-in starts in a second; a real model load takes minutes

[stop]
timeout_s = 10

# Run after /health answers and before the enter counts as done (`reconciler probe {name}` runs them on demand).
[[probes]]
name = "models"
kind = "models"

[[probes]]
name = "smoke"
prompt = "Reply with the single word: ready"
matches = "(?i)ready"
"""


def stand_in_manifest_yaml(name: str) -> str:
    lines = [
        "# Which recipe owns which GPU slot; a slot not listed is free. Remove an assignment and its lane leaves.",
        f"host: {name}",
        "assignments:",
    ]
    for recipe, (slot, _port) in STAND_IN_RECIPES.items():
        lines += [f"  - recipe: {recipe}", f"    gpus: [{slot}]"]
    return "\n".join(lines) + "\n"


def stand_in_files(machine: Machine) -> dict[str, str]:
    """Relative path -> text of every file ``init --no-gpu`` writes (host ``try``, whatever the machine's name: one
    name the tutorial can show), the real vLLM's recipe template among them."""
    out = {
        "configs/host.yaml": stand_in_host_yaml(machine, STAND_IN_HOST),
        f"manifests/{STAND_IN_HOST}.yaml": stand_in_manifest_yaml(STAND_IN_HOST),
        RECIPE_TEMPLATE: RECIPE_TEXT,
    }
    for recipe, (slot, port) in STAND_IN_RECIPES.items():
        out[f"configs/recipes/{recipe}.toml"] = stand_in_recipe(recipe, slot, port)
    return out
