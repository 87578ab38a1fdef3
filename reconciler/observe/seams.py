"""Where one observation reads each source of the host: ``ObserveSeams``, one function per source.

``reconciler.observe.observe`` assembles every fact of an ``Observed`` from these, in one place, and nothing else
builds one from the host: the host's own (``REAL_SEAMS``, the default) read Docker's or Podman's engine, NVML,
/proc and shm.dir, /proc/net and each sleeping-mode lane's ``GET /is_sleeping``; the simulation (tests/sim) gives
its world's answer for each and runs the same ``observe``. A fact added to the observation is added there once and
reaches the planner, the approval fingerprint (which walks every field of ``Observed``) and the simulation; a
source added here is one the simulation must give (its check of every part of its ``HostIO`` walks these too).

The files this install keeps (its ownership record, the lanes' measured memory) are no seam: they are the tool's
own, under its state directory, read as they are by every run, the simulated ones included.

Light to import (the start-up budget, docs/performance.md): each of the host's own readers is imported when first
called, so one observer run alone (``python -m reconciler.observe.shm``) pays for none of the others.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconciler.model import HostConfig, ShmConfig
    from reconciler.observe.containers import EngineObserver
    from reconciler.plan.observed import ContainerView, GpuView, Listener, NodeHolder, Reading, ShmView


@dataclass(frozen=True)
class ObserveSeams:
    """The reads of one observation, each of one source (their call shapes are the host's own readers')."""

    # The observer of a host's engine (``EngineObserver.for_host``): containers, images, the engine's GPU runtime.
    engine: Callable[[HostConfig], EngineObserver]
    # Whether NVIDIA's container toolkit hook is installed on this machine (a local engine's GPU runtime).
    toolkit_hook: Callable[[], bool]
    # ``observe_gpus(host, *, known_containers)``: NVML's cards, their memory and processes, each to its container.
    gpus: Callable[..., GpuView]
    # ``inspect_shm(cfg, *, containers, docker, settled, on_cards)``: shm.dir and one scan of every process, which
    # hands ``on_cards`` the holders of card nodes when the scan was made whole.
    processes: Callable[..., ShmView]
    # ``read_listeners(ports, *, known_containers)``: (the ports looked up, who listens on them), from /proc/net.
    listeners: Callable[..., tuple[frozenset[int], tuple[Listener, ...]]]
    # ``ask_sleeping(origin)``: a sleeping-mode lane's own answer to GET /is_sleeping, or why there is none.
    is_sleeping: Callable[[str], bool | str]


def _engine(host: HostConfig) -> EngineObserver:
    from reconciler.observe.containers import EngineObserver  # start-up: the engine's reader on first use

    return EngineObserver.for_host(host)


def _toolkit_hook() -> bool:
    from reconciler.observe.containers import toolkit_hook_installed  # start-up: as above

    return toolkit_hook_installed()


def _gpus(host: HostConfig, *, known_containers: Collection[str] | None = None) -> GpuView:
    from reconciler.observe.gpu import observe_gpus  # start-up: NVML's reader on first use

    return observe_gpus(host, known_containers=known_containers)


def _processes(
    cfg: ShmConfig,
    *,
    containers: Sequence[ContainerView],
    docker: Reading,
    settled: Collection[str] = (),
    on_cards: Callable[[tuple[NodeHolder, ...]], None] | None = None,
) -> ShmView:
    from reconciler.observe.shm import inspect_shm  # start-up: the /proc scan on first use

    return inspect_shm(cfg, containers=containers, docker=docker, settled=settled, on_cards=on_cards)


def _listeners(
    ports: Collection[int], *, known_containers: Collection[str] | None
) -> tuple[frozenset[int], tuple[Listener, ...]]:
    from reconciler.observe.listeners import read_listeners  # start-up: only a plan with enters reads ports

    return read_listeners(ports, known_containers=known_containers)


def _is_sleeping(origin: str) -> bool | str:
    from reconciler.observe.lane_sleep import ask_sleeping  # start-up: only hosts with sleeping lanes ask

    return ask_sleeping(origin)


REAL_SEAMS = ObserveSeams(
    engine=_engine,
    toolkit_hook=_toolkit_hook,
    gpus=_gpus,
    processes=_processes,
    listeners=_listeners,
    is_sleeping=_is_sleeping,
)
