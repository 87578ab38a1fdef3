"""Observation: reads the engine, GPU telemetry, /proc and the shm dir, the ports and the lanes' sleep into one
``Observed`` value. Read-only.

Called by ``plan``, ``status``, ``apply`` (before and after each action) and the loop, through ``HostIO.observe``.
``observe`` is the one place an observation is assembled: each source is read through its seam
(``reconciler.observe.seams``: the host's own, or the simulation's world) and every fact goes into the one
constructor, ``reconciler.plan.observed.observation``. Each source that fails is recorded as unavailable in the
result instead of raising, so callers can fail closed and say which one. The submodules are imported inside
``observe`` so that importing one observer (``python -m reconciler.observe.shm``, say) does not pay for pydantic,
the Docker SDK and NVML.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

# Both light (the seams import each real reader on first use; the values are dataclasses), and loaded by every
# observer already.
from reconciler.observe.seams import REAL_SEAMS, ObserveSeams
from reconciler.plan.observed import CardNodes, EnterFacts, LaneMemory, NodeHolder, Observed, observation

if TYPE_CHECKING:
    from reconciler.model import HostConfig
    from reconciler.observe.containers import EngineObserver


def observe(
    host: HostConfig,
    *,
    seams: ObserveSeams | None = None,
    docker: EngineObserver | None = None,
    images: Collection[str] = (),
    ports: Collection[int] = (),
    sleep_origins: Mapping[str, str] | None = None,
) -> Observed:
    """One observation, every source read through ``seams`` (``REAL_SEAMS``: the host's own); ``docker``: the
    engine's observer to read through (its cache kept), else ``seams.engine``'s. ``images`` and ``ports``
    (``enter_checks.enter_needs``: what the recipes' enters need) are looked up for the planner's checks of knowable
    failures; without them those are not judged. ``sleep_origins`` (recipe -> its lane's origin, for the recipes
    with [sleep]): each running lane of this host of those recipes is asked whether it sleeps."""
    # start-up: one observer alone (python -m reconciler.observe.shm) pays for no state file's reader (docstring)
    from reconciler.store.state import read_ownership

    seams = seams or REAL_SEAMS
    docker = docker or seams.engine(host)
    containers, docker_reading = docker.observe()
    known = {c.id for c in containers} if docker_reading.ok else None
    gpus = seams.gpus(host, known_containers=known)
    ownership = read_ownership(host.name)
    found: list[tuple[NodeHolder, ...]] = []
    shm = seams.processes(
        host.shm, containers=containers, docker=docker_reading, settled=ownership.healthy, on_cards=found.append
    )
    # The card nodes held open are read by the shm guard's scan of every process (the same stat of each
    # descriptor), handed over only when that scan was made whole.
    card_nodes = CardNodes(found[0]) if found else CardNodes(read=False, detail=shm.proc.render())
    enter = EnterFacts()
    if docker_reading.ok and (images or ports):
        gpu_asked = host.docker.gpu_requests and host.gpus
        runtime, detail = docker.gpu_runtime(seams.toolkit_hook) if gpu_asked else ("unknown", "")
        looked_up, listeners = seams.listeners(ports, known_containers=known)
        enter = EnterFacts(
            images=docker.images_present(images),
            gpu_runtime=runtime,
            gpu_runtime_detail=detail,
            ports=looked_up,
            listeners=listeners,
        )
    sleeping: dict[str, bool] = {}
    memory: dict[str, LaneMemory] = {}
    if docker_reading.ok and sleep_origins:
        from reconciler.observe.lane_sleep import read_sleeping  # start-up: only hosts with sleeping lanes ask
        from reconciler.store.lane_memory import read_lane_memory  # start-up: as above

        sleeping = read_sleeping(host.name, containers, sleep_origins, seams.is_sleeping)
        memory = read_lane_memory(host.name)
    return observation(
        host.name,
        containers=containers,
        docker=docker_reading,
        gpus=gpus,
        shm=shm,
        ownership=ownership,
        enter=enter,
        sleeping=sleeping,
        lane_memory=memory,
        card_nodes=card_nodes,
    )
