"""The host's I/O seams as one object: ``HostIO``, handed to the applier, the shm guard and the loop.

Everything the tool reads of the host or does to it, below the decisions, goes through one of its parts: the
engine (an observer of a host's engine, whose client also writes), the sources of one observation (the engine,
NVML, /proc and shm.dir, the ports, the lanes' sleep: ``reconciler.observe.seams.ObserveSeams``, assembled by
``reconciler.observe.observe`` alone, which ``HostIO.observe`` calls with them), who listens on a port (/proc/net), the
lanes' HTTP (their health URL, their POSTs of a sleep, a wake and a drain, their gauges, GET /is_sleeping, what
they say of themselves), the guard's reads and its one unlink (``shm_guard.ShmIO``), the loader's tmpfs reads
(``load.tmpfs.TmpfsReads``), the clocks and the wait (``base.clock.Clock``), how a group of actions runs at
once (threads, and the lock that keeps the guard and the state files to one action at a time), and the lock of the
manifest's edits that serialises switches (``store.lock.manifest_edit_lock``: an flock across processes).

``REAL_IO`` is the host's own. The simulation (tests/sim) builds one whose every part answers from its world and
hands it in whole, as FoundationDB's simulation replaces its one ``INetwork``: nothing between the seams is
replaced, and no private name is patched. A part added here is a part the simulation must give (a ``HostIO`` has
no default it could forget to replace: ``test_sim`` checks that every part of its ``HostIO`` is its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.apply.groups import run_in_threads
from reconciler.apply.http_check import _http_answer, _http_ok
from reconciler.apply.lane_http import Answer
from reconciler.apply.lane_http import request as lane_request
from reconciler.apply.ports import PortView, _port_listeners
from reconciler.base.clock import REAL_CLOCK, Clock
from reconciler.load.tmpfs import REAL_TMPFS, TmpfsReads
from reconciler.observe import observe
from reconciler.observe.containers import EngineObserver
from reconciler.observe.lane_sleep import ask_sleeping
from reconciler.observe.seams import REAL_SEAMS, ObserveSeams
from reconciler.store.door_state import door_lane, mark_taken_down, read_taken_down
from reconciler.store.lock import manifest_edit_lock

if TYPE_CHECKING:
    from reconciler.apply.shm_guard import ShmIO
    from reconciler.model import HostConfig
    from reconciler.plan.observed import Observed


def _read_gauges(url: str, *, timeout: float = 2.0) -> tuple[float, float] | str:
    # the start-up budget: the gauges' parser (prometheus_client) is imported by the first drain only
    from reconciler.apply.vllm_metrics import read_gauges

    return read_gauges(url, timeout=timeout)


def _lane_readings(desired: Any, observed: Any) -> dict[str, Any]:
    # the start-up budget: its parser (prometheus_client) is imported by the loop's first pass only
    from reconciler.observe.lanes import lane_readings

    return lane_readings(desired, observed)


@dataclass(frozen=True)
class LaneHttp:
    """What the tool asks a lane over HTTP (never through a proxy)."""

    health_ok: Callable[[str], bool]  # the health URL answers 2xx
    answer: Callable[..., str | None]  # what answers a URL, in words; None when nothing listens there
    request: Callable[[str, dict[str, Any] | None, float], Answer]  # a GET, or a POST of JSON (sleep, wake, /pause)
    gauges: Callable[..., tuple[float, float] | str]  # vLLM's running and waiting requests, or why not
    is_sleeping: Callable[..., bool | str]  # GET /is_sleeping: True, False, or why there is no answer
    readings: Callable[[Any, Any], dict[str, Any]]  # what each running lane says of itself (the loop's metrics)
    # What the host's front door says of a lane (host, recipe): (when it last looked, its requests in flight there,
    # whether it admits new ones), or None without a live door (``reconciler.store.door_state``).
    front: Callable[[str, str], tuple[float, int, bool] | None]
    # A lane being taken down (host, recipe, slots), published for the door: the undo (``mark_taken_down``); and the
    # recipes whose lanes are being taken down now (host), as the door reads them.
    taking_down: Callable[[str, str, str], Callable[[], None]] = mark_taken_down
    taken_down: Callable[[str], frozenset[str]] = read_taken_down


@dataclass(frozen=True)
class HostIO:
    """The host as the tool meets it. ``shm`` None: the real guard's (imported on the first reclaim only: the
    start-up budget of a converged ``reconciler apply``, docs/performance.md)."""

    clock: Clock
    engine: Callable[[Any], EngineObserver]  # the observer of a host's engine (``EngineObserver.for_host``)
    sources: ObserveSeams  # where one observation reads each source (``reconciler.observe.observe`` assembles it)
    listeners: Callable[[Mapping[int, str]], PortView | None]  # who listens on each port, from /proc
    lanes: LaneHttp
    shm: ShmIO | None
    tmpfs: TmpfsReads
    run_group: Callable[[list[Callable[[], Any]]], list[Any]]  # a group's actions, each in a thread of its own
    lock: Callable[[], Any]  # a lock of the apply layer (the guard's, the state files')
    edit_lock: Callable[[str], AbstractContextManager[None]]  # one edit of a host's manifest at a time (a switch)

    def observe(self, host: HostConfig, **needs: Any) -> Observed:
        """One whole observation of ``host`` from these sources (``reconciler.observe.observe``'s keywords: the
        engine's observer to read through, what the enters need looked up, the sleeping lanes' origins)."""
        return observe(host, seams=self.sources, **needs)


REAL_LANES = LaneHttp(
    health_ok=_http_ok,
    answer=_http_answer,
    request=lane_request,
    gauges=_read_gauges,
    is_sleeping=ask_sleeping,
    readings=_lane_readings,
    front=door_lane,
)

REAL_IO = HostIO(
    clock=REAL_CLOCK,
    engine=EngineObserver.for_host,
    sources=REAL_SEAMS,
    listeners=_port_listeners,
    lanes=REAL_LANES,
    shm=None,
    tmpfs=REAL_TMPFS,
    run_group=run_in_threads,
    lock=threading.Lock,
    edit_lock=manifest_edit_lock,
)
