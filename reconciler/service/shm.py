"""``reconciler shm status``: the offload tmpfs as the guard sees it, every file with its owners and its state.

Called by ``reconciler.service.host_service.HostService.shm_status``; the cleanup is ``reconciler.service.reclaim``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.observe.containers import EngineObserver
from reconciler.observe.shapes import status_json
from reconciler.observe.shm import inspect_shm
from reconciler.service.results import EXIT_ERROR, EXIT_OK
from reconciler.store.state import read_ownership

if TYPE_CHECKING:
    from reconciler.model import HostConfig
    from reconciler.plan.observed import ShmView


@dataclass
class ShmStatusResult:
    view: ShmView

    def to_json(self) -> dict[str, Any]:
        return status_json(self.view)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.view.readings_ok else EXIT_ERROR


def shm_status(host: HostConfig) -> ShmStatusResult:
    """``reconciler shm status``: every offload file of ``host``'s tmpfs with its owners and its state."""
    containers, docker = EngineObserver.for_host(host).observe()
    settled = read_ownership(host.name).healthy
    return ShmStatusResult(inspect_shm(host.shm, containers=containers, docker=docker, settled=settled))
