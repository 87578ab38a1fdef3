"""Prometheus metrics of the reconciler: the state the loop keeps current on ``/metrics``.

Called by the loop (``reconciler run``): it builds one ``Metrics`` at start, calls ``configure`` after every valid
load, ``observe_state`` after every observe+plan, ``record_pass`` at the end of each pass, ``record_action``,
``record_reclaim`` and ``record_refusal`` for what the apply layer's outcomes report (its own passes', and those the
front-ends it serves take: the HTTP API, MCP and the command line over its socket, through the service's
``ActionHooks``), and ``set_manifest_valid`` / ``set_backoff`` as they change. The HTTP handler serves
``render()`` with ``CONTENT_TYPE``.

Everything lives on a dedicated ``CollectorRegistry`` (never the process-global one), so tests and the loop can
hold several instances side by side. Every label combination that is known in advance (pass results, action
kinds and results, refusal reasons, sources, offload states, configured recipes) is created at start with 0,
so ``rate()`` and ``increase()`` see the first event and alerts can tell "zero" from "never exported". The
families themselves are defined in ``reconciler.loop.metric_families``, the probe families in
``reconciler.loop.probe_metrics``.

``prometheus_client`` is imported by these modules of the loop and by ``reconciler.apply.probes`` (which parses a
lane's own exposition); the model and the planner stay free of it.
"""

from __future__ import annotations

import math
import platform
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from reconciler import __version__
from reconciler.base.redact import redact_text
from reconciler.loop.metric_families import (
    ACTION_KINDS,
    ACTION_RESULTS,
    GIT_STATES,
    HTTP_DROPS,
    HTTP_REFUSALS,
    OFFLOAD_STATES,
    PAGE_CACHE_RESULTS,
    PASS_RESULTS,
    REFUSAL_REASONS,
    SOURCE_STATES,
    SOURCES,
    SUCCESS_RESULTS,
    MetricFamilies,
)
from reconciler.loop.probe_metrics import ProbeCollector
from reconciler.model import HostConfig
from reconciler.observe.lanes import LaneReading
from reconciler.plan.actions import ActionKind, Fallback, Plan
from reconciler.plan.claims import claimed_slots, owner_kind, slot_ids
from reconciler.plan.observed import LABEL_HOST, ContainerView, Observed
from reconciler.plan.verdict import WORDS, Verdict
from reconciler.plan.vram import slot_vram, unlisted_used_bytes

if TYPE_CHECKING:
    from reconciler.apply.results import Outcome

CONTENT_TYPE = CONTENT_TYPE_LATEST
# A label value is a line of text, not a log: long loader errors are cut here.
MAX_ERROR_LABEL = 300


@dataclass(frozen=True)
class SlotOwner:
    """One holder of a GPU slot as exported by ``reconciler_gpu_owner_info``."""

    owner: str  # managed | unmanaged | process | free | unlisted
    recipe: str = ""
    container: str = ""


def _container_owner(c: ContainerView, observed: Observed) -> SlotOwner:
    """A container on a slot: ours (by this host's labels, not a copy of a lane of ours), or not."""
    ours = c.managed and c.labels.get(LABEL_HOST, observed.host) == observed.host
    if ours and owner_kind(c, observed.host, observed.ownership) != "copied":
        return SlotOwner("managed", c.recipe or "", c.name)
    return SlotOwner("unmanaged", "", c.name)


def _process_owner(container_id: str | None, by_id: Mapping[str, ContainerView], observed: Observed) -> SlotOwner:
    """A process NVML lists on a slot: its container's owner, or a bare process."""
    ctr = by_id.get(container_id) if container_id else None
    if ctr is not None:
        return _container_owner(ctr, observed)
    if container_id:
        # A container Docker did not list (created after the listing): name it by its short id.
        return SlotOwner("unmanaged", "", container_id[:12])
    return SlotOwner("process")


def gpu_owners(observed: Observed, host: HostConfig | None = None) -> dict[str, tuple[SlotOwner, ...]]:
    """Who holds each GPU slot: containers (by our label or their device requests) and bare GPU processes.

    Pure. Uses the planner's ``claimed_slots`` so metrics and plan agree on who holds what. A slot nobody
    holds gets one ``free`` entry. With ``gpu_telemetry: none`` bare processes are invisible, so "free" then
    means "no container claims it".
    """
    slots: list[str] = list(host.gpus) if host is not None else []
    slots += [s for s in observed.gpus.slots if s not in slots]
    ids = slot_ids(host, observed)
    found: dict[str, list[SlotOwner]] = {s: [] for s in slots}
    all_slots = tuple(slots)
    for c in observed.containers:
        if not c.active:
            continue
        for slot in claimed_slots(c, ids, all_slots, host=observed.host):
            owner = _container_owner(c, observed)
            if slot in found and owner not in found[slot]:
                found[slot].append(owner)
    by_id = {c.id: c for c in observed.containers}
    for slot, view in observed.gpus.slots.items():
        for p in view.processes:
            owner = _process_owner(p.container_id, by_id, observed)
            if owner not in found[slot]:
                found[slot].append(owner)
    if host is not None and observed.gpus.telemetry == "nvml" and observed.gpus.reading.ok:
        for slot, owners in found.items():
            # VRAM in use, no process listed, no container: held by something NVML does not show (WSL2).
            if not owners and unlisted_used_bytes(host, observed.gpus.slots.get(slot)) is not None:
                owners.append(SlotOwner("unlisted"))
    return {s: tuple(o) if o else (SlotOwner("free"),) for s, o in found.items()}


class Metrics(MetricFamilies):
    """The reconciler's metrics on their own registry. Thread-safe: the loop updates, the HTTP thread renders.

    Derived state (GPU owners, offload files, pending actions) is replaced whole under a lock, so a scrape
    never sees a half-updated picture.
    """

    def __init__(
        self,
        host: HostConfig | None = None,
        *,
        recipes: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
        process_metrics: bool = True,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._host: HostConfig | None = None
        self._recipes: set[str] = set()
        self._in_backoff: set[str] = set()
        self._slots: set[str] = set()
        self._owner_series: set[tuple[str, str, str, str]] = set()
        self._error_label: str | None = None
        self._git_series: tuple[str, str] | None = None
        self._fallback_labels: set[tuple[str, str, str]] = set()
        self._sleep_series: set[tuple[str, str]] = set()
        self._lane_info: set[tuple[str, str, str]] = set()
        self._lane_series: set[tuple[str, str]] = set()
        r = self.registry
        MetricFamilies.__init__(self, r)

        # The last run of each recipe's probe suites, read from the host's state at each scrape: a suite run by the
        # loop's enter, the command line, the API or MCP shows at once, whichever process ran it.
        self.registry.register(
            ProbeCollector(lambda: self._host.name if self._host is not None else None, lambda: set(self._recipes))
        )

        if process_metrics:
            # process_resident_memory_bytes and friends: the footprint goals of the loop are watched by these.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)

        self.build_info.info({"version": __version__, "python": platform.python_version()})
        self.start_time.set(self._clock())
        for result in PASS_RESULTS:
            self.passes.labels(result=result)
            self.pass_duration.labels(result=result)
        for kind in ACTION_KINDS:
            self.pending.labels(kind=kind)
            for result in ACTION_RESULTS:
                self.actions.labels(kind=kind, result=result)
                self.action_duration.labels(kind=kind, result=result)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason=reason)
        for how in ("wake", "cold"):
            self.switch_seconds.labels(how=how)
        for status, reason in HTTP_REFUSALS:
            self.http_refusals.labels(status=str(status), reason=reason)
        for reason in HTTP_DROPS:
            self.http_drops.labels(reason=reason)
        for state in OFFLOAD_STATES:
            self.offload_files.labels(state=state)
            self.offload_bytes.labels(state=state)
        for excused in ("true", "false"):
            self.uninspectable.labels(excused=excused)
        for drop in PAGE_CACHE_RESULTS:
            self.page_cache_drops.labels(result=drop)
        # Sources start down and the manifest invalid: nothing is known until the first pass says otherwise.
        for source in SOURCES:
            self.source_up.labels(source=source).set(0)
            for state in SOURCE_STATES:
                self.source_state.labels(source=source, state=state).set(0)
        self.manifest_valid.set(0)
        self.configure(host=host, recipes=recipes)

    # ------------------------------------------------------------ configuration

    def configure(self, *, host: HostConfig | None, recipes: Iterable[str]) -> None:
        """Create the children of every configured recipe and GPU slot; drop those no longer configured.

        Call after every valid load (recipes and slots may change on an edit). A recipe still in backoff is
        kept until ``set_backoff(recipe, None)``.
        """
        names = set(recipes)
        with self._lock:
            if host is not None:
                self._host = host
                self.host_info.clear()
                self.host_info.labels(host=host.name, gpu_telemetry=host.gpu_telemetry, shm_dir=host.shm.dir).set(1)
                gone_slots = self._slots - set(host.gpus)
                for slot in gone_slots:
                    self._remove_slot(slot)
                self._slots = set(host.gpus)
            # A recipe removed while in backoff stays visible until its backoff is cleared.
            names |= self._in_backoff
            for recipe in self._recipes - names:
                for g in (self.backoff, self.backoff_until, self.backoff_failures):
                    _discard(g, recipe)
            for recipe in names - self._recipes:
                self.backoff.labels(recipe=recipe)
                self.backoff_until.labels(recipe=recipe)
                self.backoff_failures.labels(recipe=recipe)
            self._recipes = names

    def _remove_slot(self, slot: str) -> None:
        for g in (
            self.gpu_mem_used,
            self.gpu_mem_total,
            self.gpu_processes,
            self.gpu_mem_free,
            self.gpu_mem_reserve,
            self.gpu_below_reserve,
            self.gpu_mem_unlisted,
        ):
            _discard(g, slot)
        for key in [k for k in self._owner_series if k[0] == slot]:
            self.gpu_owner.remove(*key)
            self._owner_series.discard(key)

    # ------------------------------------------------------------ state of one pass

    def observe_state(self, observed: Observed, plan: Plan | None) -> None:
        """Export what one observation saw and what the plan wants. ``plan`` is None when no valid desired
        state was ever loaded: the plan gauges then keep their values (drift stays as it was)."""
        owners = gpu_owners(observed, self._host)
        shm = observed.shm
        with self._lock:
            self.host_info.clear()
            self.host_info.labels(host=observed.host, gpu_telemetry=observed.gpus.telemetry, shm_dir=shm.dir).set(1)
            for name, src in observed.readings.items():
                self.source_up.labels(source=name).set(1 if src.ok else 0)
                current = "ok" if src.ok else (src.cause if src.cause in SOURCE_STATES else "error")
                for state in SOURCE_STATES:
                    self.source_state.labels(source=name, state=state).set(1 if state == current else 0)

            series = {(slot, o.recipe, o.container, o.owner) for slot, os_ in owners.items() for o in os_}
            for key in self._owner_series - series:
                self.gpu_owner.remove(*key)
            for key in series - self._owner_series:
                self.gpu_owner.labels(*key).set(1)
            self._owner_series = series

            lanes = {
                (c.recipe or "", ",".join(c.slots)): observed.sleeping[c.id]
                for c in observed.containers
                if c.id in observed.sleeping
            }
            for lane in self._sleep_series - set(lanes):
                self.lane_sleeping.remove(*lane)
            for lane, asleep in lanes.items():
                self.lane_sleeping.labels(*lane).set(1 if asleep else 0)
            self._sleep_series = set(lanes)

            telemetry_ok = observed.gpus.telemetry != "none" and observed.gpus.reading.ok
            for slot in set(owners) | set(observed.gpus.slots):
                view = observed.gpus.slots.get(slot)
                known = telemetry_ok and view is not None and not view.missing
                _set_or_discard(self.gpu_mem_used, slot, view.memory_used_bytes if known and view else None)
                _set_or_discard(self.gpu_mem_total, slot, view.memory_total_bytes if known and view else None)
                _set_or_discard(self.gpu_processes, slot, len(view.processes) if known and view else None)
                fig = slot_vram(self._host, view) if known and self._host is not None else None
                _set_or_discard(self.gpu_mem_free, slot, fig.free_bytes if fig else None)
                _set_or_discard(self.gpu_mem_reserve, slot, fig.reserve_bytes if fig else None)
                _set_or_discard(self.gpu_below_reserve, slot, (1 if fig.below_reserve else 0) if fig else None)
                unlisted = unlisted_used_bytes(self._host, view) if fig and self._host is not None else None
                _set_or_discard(self.gpu_mem_unlisted, slot, (unlisted or 0) if fig else None)

            for state in ("owned", "orphan", "blocked"):
                files = shm.by_state(state)
                self.offload_files.labels(state=state).set(len(files))
                self.offload_bytes.labels(state=state).set(sum(f.allocated_bytes for f in files))
            self.offload_files.labels(state="deleted").set(len(shm.deleted_mapped))
            self.offload_bytes.labels(state="deleted").set(shm.deleted_mapped_bytes)
            self.tmpfs_size.set(shm.tmpfs.size_bytes)
            self.tmpfs_free.set(shm.tmpfs.free_bytes)
            excused = sum(1 for u in shm.uninspectable if u.excused)
            self.uninspectable.labels(excused="true").set(excused)
            self.uninspectable.labels(excused="false").set(len(shm.uninspectable) - excused)

            if plan is not None:
                for kind in ACTION_KINDS:
                    self.pending.labels(kind=kind).set(sum(1 for a in plan.actions if a.kind.value == kind))
                self.blocked.set(len(plan.blockers))
                self.held.set(len(plan.held))
                converged = plan.converged
                self.drift.set(0 if converged else 1)
                if converged:
                    self.last_converged.set(self._clock())

    def observe_lanes(self, readings: Iterable[LaneReading]) -> None:
        """Export what each running lane's server said of itself at this pass; a lane gone since, or a gauge its
        /metrics no longer shows, is removed (absent, never 0)."""
        with self._lock:
            info, series = set(), set()
            for r in readings:
                slot = ",".join(r.slots)
                info.add((r.recipe, slot, r.version or ""))
                series.add((r.recipe, slot))
                self.lane_up.labels(recipe=r.recipe, slot=slot).set(0 if r.error else 1)
                for key, g in self.lane_gauges.items():
                    if key in r.gauges:
                        g.labels(recipe=r.recipe, slot=slot).set(r.gauges[key])
                    else:
                        g.remove(r.recipe, slot)
            for gone in self._lane_info - info:
                self.lane_info.remove(*gone)
            for labels in info:
                self.lane_info.labels(*labels).set(1)
            for left in self._lane_series - series:
                self.lane_up.remove(*left)
                for g in self.lane_gauges.values():
                    g.remove(*left)
            self._lane_info, self._lane_series = info, series

    def record_listener_restart(self) -> None:
        self.listener_restarts.inc()

    def record_http_refusal(self, status: int, reason: str) -> None:
        """Count one refusal of the HTTP listener; (status, reason) is a key of HTTP_REFUSALS."""
        if (status, reason) not in HTTP_REFUSALS:
            raise ValueError(f"unknown HTTP refusal {status} {reason!r}; expected one of {sorted(HTTP_REFUSALS)}")
        self.http_refusals.labels(status=str(status), reason=reason).inc()

    def record_http_drop(self, reason: str) -> None:
        """Count one connection the listener closed itself; ``reason`` is one of HTTP_DROPS."""
        _check(reason, HTTP_DROPS, "connection drop reason")
        self.http_drops.labels(reason=reason).inc()

    def record_pass(self, result: str, seconds: float) -> None:
        """Count one finished pass and its duration; moves the last-pass and last-success timestamps."""
        _check(result, PASS_RESULTS, "pass result")
        self.passes.labels(result=result).inc()
        self.pass_duration.labels(result=result).observe(max(seconds, 0.0))
        now = self._clock()
        self.last_pass.set(now)
        if result in SUCCESS_RESULTS:
            self.last_success.set(now)
            self.consecutive_failures.set(0)
        else:
            self.consecutive_failures.inc()

    def record_action(self, kind: str | ActionKind, result: str, seconds: float) -> None:
        """Count one action of the apply layer with its result (ok|failed|refused) and duration."""
        k = kind.value if isinstance(kind, ActionKind) else kind
        _check(k, ACTION_KINDS, "action kind")
        _check(result, ACTION_RESULTS, "action result")
        self.actions.labels(kind=k, result=result).inc()
        self.action_duration.labels(kind=k, result=result).observe(max(seconds, 0.0))

    def record_switch(self, how: str, seconds: float) -> None:
        """A lane brought in by a wake or a cold enter, and how long it took to serve."""
        _check(how, ("wake", "cold"), "switch how")
        self.switch_seconds.labels(how=how).observe(max(seconds, 0.0))

    def record_outcome(self, o: Outcome) -> None:
        """One action's outcome: its count and duration, a refusal, a lane brought in, bytes freed, dark time."""
        a = o.action
        self.record_action(a.kind, "failed" if o.result == "interrupted" else o.result, o.seconds)
        if o.result == "refused" and a.kind in (ActionKind.ENTER, ActionKind.WAKE):  # its own preflight or rule 1
            self.record_refusal(o.refusal)  # (the guard's refusals are counted from its result: _on_reclaim)
        if o.result == "ok" and a.kind in (ActionKind.ENTER, ActionKind.WAKE):
            self.record_switch("wake" if a.kind is ActionKind.WAKE else "cold", o.seconds)
        if o.reclaimed_bytes:
            self.record_reclaim(o.reclaimed_bytes)
        if "page_cache" in o.extra:
            self.record_page_cache(o.extra["page_cache"])
        if "dark_s" in o.extra:
            self.record_dark(o.extra["dark_s"])

    def record_dark(self, dark: Mapping[str, float]) -> None:
        """An enter's dark time per slot (``Outcome.extra["dark_s"]``)."""
        for slot, seconds in dark.items():
            self.slot_dark.labels(slot=slot).observe(max(float(seconds), 0.0))

    def record_page_cache(self, drop: Mapping[str, object]) -> None:
        """A leave's page-cache drop (``PageCacheDrop.to_json()``): its result and Cached before and after."""
        result = str(drop.get("result"))
        _check(result, PAGE_CACHE_RESULTS, "page cache result")
        self.page_cache_drops.labels(result=result).inc()
        with self._lock:
            for when in ("before", "after"):
                value = drop.get(f"{when}_bytes")
                if isinstance(value, int):
                    self.page_cache.labels(when=when).set(value)

    def record_reclaim(self, nbytes: int) -> None:
        """Add the bytes a verified reclaim freed (the allocated size of the deleted files)."""
        if nbytes < 0:
            raise ValueError(f"reclaimed bytes must be >= 0, got {nbytes}")
        self.reclaimed.inc(nbytes)

    def record_refusal(self, reason: str) -> None:
        """Count one refusal; ``reason`` is a key of REFUSAL_REASONS."""
        _check(reason, tuple(REFUSAL_REASONS), "refusal reason")
        self.refusals.labels(reason=reason).inc()

    def set_manifest_valid(self, ok: bool, error: str = "") -> None:
        """Say whether the last load validated; on failure export the first line of ``error`` and its time."""
        with self._lock:
            self.manifest_valid.set(1 if ok else 0)
            label = None if ok else _error_label(error)
            if label != self._error_label:
                if self._error_label is not None:
                    self.manifest_error.remove(self._error_label)
                if label is not None:
                    self.manifest_error.labels(error=label).set(1)
                self._error_label = label
            if not ok:
                self.manifest_last_error.set(self._clock())

    def set_git_source(self, *, commit: str | None, ref: str, state: str, fetched_at: float | None) -> None:
        """The host's git source after a sync: the commit in use (one series), its state, its last answered fetch."""
        with self._lock:
            now = (commit, ref) if commit else None
            if now != self._git_series:
                if self._git_series is not None:
                    self.git_commit.remove(*self._git_series)
                if now is not None:
                    self.git_commit.labels(commit=now[0], ref=now[1]).set(1)
                self._git_series = now
            for name in GIT_STATES:
                self.git_state.labels(state=name).set(1 if name == state else 0)
            self.git_last_fetch.set(fetched_at or 0)

    def set_verdict(self, verdict: Verdict) -> None:
        """The host's verdict as every view gives it (``reconciler.plan.verdict``), set by the listener at each scrape
        from the look the page, /healthz and /v1/status share: ``drift`` is 0 exactly when it is converged."""
        with self._lock:
            for word in WORDS:
                self.verdict.labels(verdict=word).set(1 if word == verdict.word else 0)
            self.drift.set(0 if verdict.word == "converged" else 1)

    def set_fallbacks(self, fallbacks: Iterable[Fallback]) -> None:
        """The fallbacks (``actions.Fallback``) in force after a pass; those no longer in force are removed."""
        with self._lock:
            now = {}
            for f in fallbacks:
                now[(f.recipe, ",".join(f.gpus), f.instead_of)] = f.next_attempt_s
            for labels in self._fallback_labels - set(now):
                _discard(self.fallback, *labels)
                _discard(self.fallback_next_attempt, *labels)
            for labels, seconds in now.items():
                self.fallback.labels(*labels).set(1)
                self.fallback_next_attempt.labels(*labels).set(seconds if seconds is not None else float("nan"))
            self._fallback_labels = set(now)

    def set_backoff(self, recipe: str, until_ts: float | None, *, failures: int | None = None) -> None:
        """Put ``recipe`` in backoff until the Unix time ``until_ts``, or take it out with None.

        ``failures`` is the count of failed enters in a row (None leaves it as it is; leaving backoff zeroes it).
        """
        with self._lock:
            self._recipes.add(recipe)
            if until_ts is None:
                self._in_backoff.discard(recipe)
                self.backoff.labels(recipe=recipe).set(0)
                self.backoff_until.labels(recipe=recipe).set(0)
                self.backoff_failures.labels(recipe=recipe).set(0)
                return
            self._in_backoff.add(recipe)
            self.backoff.labels(recipe=recipe).set(1)
            self.backoff_until.labels(recipe=recipe).set(until_ts)
            if failures is not None:
                self.backoff_failures.labels(recipe=recipe).set(failures)

    def end_backoff_wait(self, recipe: str) -> None:
        """The backoff delay of ``recipe`` ran out: it is no longer held (the alert clears), but its count of
        failed enters in a row stays until it has run stably (``set_backoff(recipe, None)``)."""
        with self._lock:
            self._in_backoff.discard(recipe)
            self.backoff.labels(recipe=recipe).set(0)
            self.backoff_until.labels(recipe=recipe).set(0)

    # ------------------------------------------------------------ exposition

    def render(self) -> bytes:
        """The text exposition format (``CONTENT_TYPE``) of every metric, consistent under concurrent updates."""
        with self._lock:
            return generate_latest(self.registry)


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; use one of: {', '.join(allowed)}")


def _discard(g: Gauge, *labels: str) -> None:
    g.remove(*labels)  # a no-op when the child was never created


def _set_or_discard(g: Gauge, slot: str, value: float | None) -> None:
    # Unknown is absent, never 0: a dashboard must not show "0 bytes used" for a GPU nobody could read.
    if value is None or (isinstance(value, float) and math.isnan(value)):
        _discard(g, slot)
    else:
        g.labels(slot=slot).set(value)


def _error_label(error: str) -> str:
    # /metrics is read without a token: a loader message quoting a URL with its password must not reach it.
    lines = [redact_text(ln.strip()) for ln in (error or "").splitlines() if ln.strip()]
    if not lines:
        return "invalid (no message)"
    first = lines[0]
    if len(lines) > 1:
        first += f" (+{len(lines) - 1} more)"
    if len(first) > MAX_ERROR_LABEL:
        first = first[: MAX_ERROR_LABEL - 1] + "…"
    return first
