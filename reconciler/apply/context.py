"""The ground every action's steps stand on: ``ActionContext``, the base of ``Applier`` and of its steps.

It declares what ``Applier.__init__`` sets up and holds what every step uses: an observation of the host (through
the host's I/O seams, ``self.io``: ``reconciler.apply.host_io``), the figures the running action measured, the one
guarded reclaim (every removal of an offload file goes through ``reconciler.apply.shm_guard``, serially), and the
pruning of the failed containers kept for their logs. The steps are ``reconciler.apply.enter``, ``.ports``, ``.drain`` and ``.leave``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from reconciler.apply.engine_ops import EngineOps
from reconciler.apply.results import Progress
from reconciler.model import DesiredState
from reconciler.observe.containers import EngineObserver
from reconciler.plan.actions import Action
from reconciler.plan.enter_checks import EnterNeeds, enter_needs
from reconciler.plan.observed import Observed
from reconciler.store.state import read_ownership

if TYPE_CHECKING:
    from reconciler.apply.host_io import HostIO
    from reconciler.apply.shm_results import ReclaimResult


class ActionContext:
    """What the steps of every action share, set up by ``Applier.__init__``: the host's desired state, its engine
    (``observer`` to read, ``ops`` to write), the caller's progress and cancel, the per-thread figures of the
    running action, and the locks that keep the guard and the state files to one action at a time."""

    desired: DesiredState
    io: HostIO
    observer: EngineObserver
    ops: EngineOps
    progress: Progress
    cancel: threading.Event
    on_reclaim: Callable[[Any], None] | None
    poll_s: float
    _unknown_listeners: dict[str, str]
    _context: threading.local
    _guard_lock: Any
    _files_lock: Any
    _needs: EnterNeeds
    fallback_view: Callable[[], tuple[Any, Any]] | None
    superseded: Callable[[Action], str | None] | None

    def observe(self) -> Observed:
        """The host now, with what the planner's checks of an enter's knowable failures need looked up: for the
        manifest's lanes, and in the loop for its fallback's too (a fallback is entered as any lane is: its port
        taken or its image gone is found by the plan, not by a failed start)."""
        needs = self._needs
        if self.fallback_view is not None:
            last_good, _next = self.fallback_view()
            if last_good:
                needs = enter_needs(self.desired, last_good)
        return self.io.observe(self.desired.host, docker=self.observer, **needs)

    def _figures(self) -> dict[str, Any]:
        """The figures the action running in this thread measured so far (its drain, probes, VRAM, page cache)."""
        return getattr(self._context, "figures", {})

    def _note(self, key: str, value: Any) -> None:
        self._context.figures = {**self._figures(), key: value}

    def _guarded_reclaim(self, *, only_paths: list[str] | None = None, claimed: Collection[str] = ()) -> ReclaimResult:
        # the start-up budget: a converged `reconciler apply` removes no file (docs/performance.md, its commands table)
        from reconciler.apply.shm_guard import reclaim

        with self._guard_lock:
            res = reclaim(
                self.desired.host.shm,
                observe_docker=self.observer.observe,
                confirm=True,
                only_paths=only_paths,
                settled=lambda: read_ownership(self.desired.host.name).healthy,
                claimed=claimed,
                io=self.io.shm,
                clock=self.io.clock,
            )
        if self.on_reclaim:
            self.on_reclaim(res)
        return res

    def _prune_kept(self, name: str) -> None:
        """A recipe that keeps failing must not pile up stopped containers: keep the newest ``keep_failed``."""
        docker = self.desired.host.docker
        try:
            own = read_ownership(self.desired.host.name)
            owned = None if own.created is None else own.created | own.adopted
            self.ops.prune_kept(
                name, host=self.desired.host.name, keep=docker.keep_failed, install_id=own.install_id, owned=owned
            )
        except Exception:  # noqa: BLE001 - pruning old evidence must never fail the action that made new evidence
            return
