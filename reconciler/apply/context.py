"""The one value every action's steps take: ``ActionContext``, built by ``Applier.__init__``.

It holds what the steps use and nothing else reaches for: the host's desired state, its I/O seams (``io``:
``reconciler.apply.host_io``), its engine (``observer`` to read, ``ops`` to write), the caller's progress and cancel,
the per-thread figures of the running action, and the locks that keep the one guarded reclaim (every removal of an
offload file goes through ``reconciler.apply.shm_guard``, serially) and the state files to one action at a time;
with an observation of the host and the pruning of the failed containers kept for their logs. The steps are objects
or functions over it: ``reconciler.apply.enter``, ``.port_checks``, ``.serving``, ``.drain``, ``.leave``, ``.sleep``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
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


@dataclass(eq=False)
class ActionContext:
    """What the steps of every action share: the host's desired state, its seams, its engine (``observer`` to read,
    ``ops`` to write), the caller's progress and cancel, the per-thread figures of the running action, and the locks
    that keep the guard and the state files to one action at a time. ``fallback_view`` and ``superseded`` are the
    loop's (set on the ``Applier``, which passes them here); None under ``reconciler apply``."""

    desired: DesiredState
    io: HostIO
    observer: EngineObserver
    ops: EngineOps
    progress: Progress
    cancel: threading.Event
    on_reclaim: Callable[[Any], None] | None = None  # sees every guarded reclaim's ReclaimResult
    poll_s: float = 0.2
    # container id -> why its ports are not yet its own (an enter's wait names it when it times out)
    unknown_listeners: dict[str, str] = field(default_factory=dict)
    # The loop's view for the fallback: () -> (last converged topology, seconds to each held lane's next attempt).
    fallback_view: Callable[[], tuple[Any, Any]] | None = None
    # The loop's check of an edit made while an enter waits for health: why the enter's lane is no longer wanted.
    superseded: Callable[[Action], str | None] | None = None
    # What each observation looks up for the planner's checks of an enter's knowable failures.
    _needs: EnterNeeds = field(init=False, repr=False)
    # Each running action's figures, per thread: actions on disjoint slots run at once.
    _context: threading.local = field(init=False, repr=False, default_factory=threading.local)
    # The guard stays serial (its two inspections see one deletion at a time), and the state and history files are
    # read, changed and written by one action at a time.
    guard_lock: Any = field(init=False, repr=False)
    files_lock: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._needs = enter_needs(self.desired)
        self.guard_lock = self.io.lock()
        self.files_lock = self.io.lock()

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

    def begin(self) -> None:
        """A new action starts in this thread: its figures start empty."""
        self._context.figures = {}

    def figures(self) -> dict[str, Any]:
        """The figures the action running in this thread measured so far (its drain, probes, VRAM, page cache)."""
        return getattr(self._context, "figures", {})

    def note(self, key: str, value: Any) -> None:
        self._context.figures = {**self.figures(), key: value}

    def guarded_reclaim(self, *, only_paths: list[str] | None = None, claimed: Collection[str] = ()) -> ReclaimResult:
        # the start-up budget: a converged `reconciler apply` removes no file (docs/performance.md, its commands table)
        from reconciler.apply.shm_guard import reclaim

        with self.guard_lock:
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

    def prune_kept(self, name: str) -> None:
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
