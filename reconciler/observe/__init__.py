"""Observation: reads Docker, GPU telemetry and /proc + the shm dir into one ``Observed`` value. Read-only.

Called by ``plan``, ``status``, ``apply`` (before and after each action) and the loop. Each source that fails
is recorded as unavailable in the result instead of raising, so callers can fail closed and say which one.
The submodules are imported inside ``observe`` so that importing one observer (``python -m
reconciler.observe.shm``, say) does not pay for pydantic, the Docker SDK and NVML.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconciler.model import HostConfig
    from reconciler.observe.containers import EngineObserver
    from reconciler.plan.observed import Observed


def observe(
    host: HostConfig,
    *,
    docker: EngineObserver | None = None,
    proc_root: str = "/proc",
    images: Collection[str] = (),
    ports: Collection[int] = (),
    sleep_origins: Mapping[str, str] | None = None,
) -> Observed:
    """One observation. ``images`` and ``ports`` (``enter_checks.enter_needs``: what the recipes' enters need) are
    looked up for the planner's checks of knowable failures; without them those are not judged. ``sleep_origins``
    (recipe -> its lane's origin, for the recipes with [sleep]): each running lane of this host of those recipes is
    asked whether it sleeps."""
    # start-up: one observer alone (python -m reconciler.observe.shm) pays for none of the others (docstring)
    from reconciler.observe.containers import EngineObserver
    from reconciler.observe.gpu import observe_gpus
    from reconciler.observe.shm import inspect_shm
    from reconciler.plan.observed import CardNodes, EnterFacts, NodeHolder, Observed
    from reconciler.store.state import read_ownership

    docker = docker or EngineObserver.for_host(host)
    containers, docker_source = docker.observe()
    known = {c.id for c in containers} if docker_source.ok else None
    gpus = observe_gpus(host, known_containers=known)
    ownership = read_ownership(host.name)
    found: list[tuple[NodeHolder, ...]] = []
    shm = inspect_shm(
        host.shm,
        containers=containers,
        docker=docker_source,
        proc_root=proc_root,
        settled=ownership.healthy,
        on_cards=found.append,
    )
    # The card nodes held open are read by the shm guard's scan of every process (the same stat of each descriptor).
    card_nodes = CardNodes(found[0]) if found else CardNodes(read=False, detail=shm.proc.render())
    enter = EnterFacts()
    if docker_source.ok and (images or ports):
        from reconciler.observe.listeners import read_listeners  # start-up: only a plan with enters reads ports

        runtime, detail = docker.gpu_runtime() if host.docker.gpu_requests and host.gpus else ("unknown", "")
        looked_up, listeners = read_listeners(ports, known_containers=known, proc_root=proc_root)
        enter = EnterFacts(
            images=docker.images_present(images),
            gpu_runtime=runtime,
            gpu_runtime_detail=detail,
            ports=looked_up,
            listeners=listeners,
        )
    sleeping: dict[str, bool] = {}
    memory = {}
    if docker_source.ok and sleep_origins:
        from reconciler.observe.lane_sleep import read_sleeping  # start-up: only hosts with sleeping lanes ask
        from reconciler.store.lane_memory import read_lane_memory  # start-up: as above

        sleeping = read_sleeping(host.name, containers, sleep_origins)
        memory = read_lane_memory(host.name)
    return Observed(
        host=host.name,
        containers=containers,
        gpus=gpus,
        shm=shm,
        docker=docker_source,
        ownership=ownership,
        enter=enter,
        sleeping=sleeping,
        lane_memory=memory,
        card_nodes=card_nodes,
    )
