"""Knowable failures of an enter, found before anything stops for it: its image absent from the engine, no NVIDIA
runtime for ``docker.gpu_requests``, its health or probe port already listened on, a command whose
``--tensor-parallel-size`` contradicts the recipe.

Pure. ``enter_needs`` tells the observe layer what to look up (called by the service and the apply layer);
``enter_problems`` is called by the planner for each enter.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TypedDict
from urllib.parse import urlsplit

from reconciler.model import DesiredAssignment, DesiredState, Recipe, container_name
from reconciler.plan.causes import BlockerCause, Problem, Problems
from reconciler.plan.observed import Observed


class EnterNeeds(TypedDict):
    images: tuple[str, ...]
    ports: tuple[int, ...]
    sleep_origins: dict[str, str]


def enter_needs(desired: DesiredState, last_good: Sequence[tuple[str, Sequence[str]]] = ()) -> EnterNeeds:
    """What observation must look up for ``enter_problems``: the images the recipes name and the ports of their
    health and probe URLs (of the running topology's lanes, the standby ones, and with a loop's view the lanes of
    ``last_good``, the last converged topology its fallback may enter), and where each recipe with [sleep] is asked
    whether its lane sleeps. Keyword arguments of ``reconciler.observe.observe``."""
    also = [recipe for recipe, _slots in last_good]
    images: dict[str, None] = {}
    ports: dict[int, None] = {}
    for name in dict.fromkeys([*(a.recipe for a in (*desired.assignments, *desired.standby)), *also]):
        r = desired.recipes.get(name)
        if r is None:
            continue
        images[r.container.image] = None
        ports.update(dict.fromkeys(recipe_ports(r)))
    sleep_origins = {n: o for n, r in desired.recipes.items() if (o := r.sleep_origin()) is not None}
    return {"images": tuple(images), "ports": tuple(ports), "sleep_origins": sleep_origins}


def recipe_ports(recipe: Recipe) -> tuple[int, ...]:
    """Pure: the loopback ports a recipe's lane answers on, by its health URL and its probes' origins."""
    urls = [recipe.health.url, *(p.base_url for p in recipe.probes)]
    out: list[int] = []
    for url in urls:
        if not url:
            continue
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue
        if port not in out:
            out.append(port)
    return tuple(out)


def command_tensor_parallel_size(command: Sequence[str]) -> int | None:
    """Pure: the ``--tensor-parallel-size`` (or ``-tp``) a vLLM command line gives, or None when it gives none; the
    last one given, as vLLM's parser reads it."""
    found: int | None = None
    for i, arg in enumerate(command):
        for flag in ("--tensor-parallel-size", "-tp"):
            value = None
            if arg == flag and i + 1 < len(command):
                value = command[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
            if value is not None:
                found = int(value) if value.strip().isdigit() else None
    return found


def enter_problems(
    d: DesiredAssignment, desired: DesiredState, observed: Observed, *, own: Collection[str | None]
) -> Problems:
    """Why an enter would fail however free its slots are, known before anything stops for it: its image is not on
    the engine (the tool never pulls), the engine cannot give GPUs by DeviceRequest under ``docker.gpu_requests:
    true``, something other than its own lane (``own``: its containers and those leaving first) listens on its
    health or probe port, or its command's ``--tensor-parallel-size`` is not the recipe's. Each says the fix."""
    recipe = desired.recipes[d.recipe]
    facts = observed.enter
    problems: Problems = []
    image = recipe.container.image
    if facts.image_present(image) is False:
        problems.append(
            Problem(
                f"image {image} is not present on this host: pull or build it (recipe {d.recipe}, "
                "container.image); the tool never pulls",
                "",
                BlockerCause.IMAGE,
            )
        )
    host = desired.host
    if host.docker.gpu_requests and facts.gpu_runtime == "absent":
        problems.append(
            Problem(
                f"the engine at {host.docker.url} has no NVIDIA runtime ({facts.gpu_runtime_detail}), and "
                "docker.gpu_requests: true asks it for GPUs by DeviceRequest: install the NVIDIA container toolkit "
                "(nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` and restart the "
                "engine), or set docker.gpu_requests: false in configs/host.yaml on a host without it",
                "",
                BlockerCause.RUNTIME,
            )
        )
    tp = command_tensor_parallel_size(recipe.container.command)
    if tp is not None and tp != recipe.tensor_parallel_size:
        problems.append(
            Problem(
                f"recipe {d.recipe}: its command says --tensor-parallel-size {tp} but tensor_parallel_size = "
                f"{recipe.tensor_parallel_size}: make them equal in configs/recipes/{d.recipe}.toml",
                "",
                BlockerCause.RECIPE,
            )
        )
    by_id = {c.id: c for c in observed.containers}
    mine = [c for c in observed.containers if c.id in own and c.active]
    for port in recipe_ports(recipe):
        listeners = facts.listening(port)
        for x in listeners or ():
            owner = by_id.get(x.container_id) if x.container_id else None
            if owner is None and x.pid is not None:
                # The engine's proxy process serves a bridged container's published port.
                owner = next((c for c in observed.containers if c.active and port in c.published_ports), None)
            if owner is not None and owner.id in own:
                continue
            if owner is None and x.pid is None and mine:
                continue  # a socket no readable process holds, while its own lane runs: judged after its leave
            who = (
                f"container {owner.name}"
                if owner is not None
                else f"pid {x.pid} ({x.command or 'a process'}) in no container of this engine"
                if x.pid is not None
                else "a socket no process here can be seen holding"
            )
            url = recipe.health.url or ""
            problems.append(
                Problem(
                    f"port {port} of recipe {d.recipe} ({url or 'probes'}) is already listened on ({x.address}:{port}"
                    f", {who}) before {container_name(d.recipe, d.slots)} is started: its health check could not "
                    "tell the new engine from it. Stop what listens there, or give the recipe another port and "
                    "health.url; nothing was created",
                    owner.name if owner is not None else (f"pid {x.pid}" if x.pid is not None else f"port {port}"),
                    BlockerCause.PORT,
                )
            )
            break
    return problems
