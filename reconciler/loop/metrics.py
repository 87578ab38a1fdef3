"""Prometheus metrics of the reconciler: what the loop exposes on ``/metrics``.

Called by the loop (``reconciler run``) and the apply layer: the loop builds one ``Metrics`` at start, calls
``configure`` after every valid load, ``observe_state`` after every observe+plan, ``record_pass`` at the end of
each pass and ``set_manifest_valid`` / ``set_backoff`` as they change; the apply layer calls ``record_action``,
``record_reclaim`` and ``record_refusal``. The HTTP handler serves ``render()`` with ``CONTENT_TYPE``.

Everything lives on a dedicated ``CollectorRegistry`` (never the process-global one), so tests and the loop can
hold several instances side by side. Every label combination that is known in advance (pass results, action
kinds and results, refusal reasons, sources, offload states, configured recipes) is created at start with 0,
so ``rate()`` and ``increase()`` see the first event and alerts can tell "zero" from "never exported".

This is the only module that imports ``prometheus_client``; the model and the planner stay free of it.
"""

from __future__ import annotations

import math
import platform
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from reconciler import __version__
from reconciler.model import HostConfig
from reconciler.plan.actions import ActionKind, Fallback, Plan
from reconciler.plan.claims import claimed_slots, owner_kind, slot_ids
from reconciler.plan.observed import LABEL_HOST, ContainerView, Observed
from reconciler.plan.vram import slot_vram, unlisted_used_bytes

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "reconciler"

# How a reconcile pass ended. converged: nothing to do; changed: actions ran and all succeeded; blocked: a
# change is needed but cannot be made safely (or is held by backoff); failed: an action failed; error: the
# pass itself could not run (load, observe or an unexpected exception).
PASS_RESULTS: tuple[str, ...] = ("converged", "changed", "blocked", "failed", "error")
# Passes that completed without a failure: they move the last-success timestamp.
SUCCESS_RESULTS = frozenset({"converged", "changed", "blocked"})
ACTION_KINDS: tuple[str, ...] = tuple(k.value for k in ActionKind)
# ok: postcondition held; failed: the action ran and did not reach its postcondition; refused: a preflight
# check said no (the reason goes to record_refusal).
ACTION_RESULTS: tuple[str, ...] = ("ok", "failed", "refused")
OWNER_KINDS: tuple[str, ...] = ("managed", "unmanaged", "process", "free", "unlisted")
PAGE_CACHE_RESULTS: tuple[str, ...] = ("dropped", "refused", "skipped")
# owned/orphan/blocked: the states of ``shm status``; deleted: unlinked but still mapped by a live process.
OFFLOAD_STATES: tuple[str, ...] = ("owned", "orphan", "blocked", "deleted")
SOURCES: tuple[str, ...] = ("docker", "proc", "gpu")
# A source's state in the last pass: answered (ok), too slowly (slow: docker.timeout_s), not at all (down), or with
# an error (error: a proxy's refusal, an unreadable /proc, a failed NVML read).
SOURCE_STATES: tuple[str, ...] = ("ok", "slow", "down", "error")

# Why the apply layer refused to act. A fixed set keeps the label bounded; each maps to a safety rule.
REFUSAL_REASONS: Mapping[str, str] = {
    "source_unavailable": "an ownership source (docker, proc, gpu) could not be read completely (Safety 3)",
    "uninspectable_process": "a process whose maps or fds cannot be read and is not excused (Safety 3)",
    "offload_container_running": "a running container has native offload configured (Safety 2)",
    "inspections_disagree": "the two inspections before a delete did not see the same files (Safety 4)",
    "file_owned": "a file gained an owner or changed inode before its unlink (Safety 4)",
    "lease_refused": "the kernel refused the write lease before an unlink: something holds the file (Safety 4)",
    "invalid_entry": "a pattern match that is a symlink, a directory or outside shm.dir (Safety 1)",
    "gpu_held": "a GPU is held by a process or container this tool does not own (blocked)",
    "tmpfs_room": "the tmpfs has no room for the recipe's offload file (Safety 6)",
    "postcondition": "an earlier step's postcondition did not hold, so the next step was not taken",
}

# What the HTTP listener refuses, by the status answered and why (reconciler.api's Guard and its protocol).
HTTP_REFUSALS: Mapping[tuple[int, str], str] = {
    (400, "header"): "a header sent twice, or a Content-Length that is not a number",
    (400, "body-json"): "a body that is not strict JSON (a duplicate key, nested too deep, not JSON)",
    (401, "token"): "no bearer token, or a wrong one",
    (403, "origin"): "a web page of another origin",
    (408, "body-timeout"): "a body that did not arrive in time",
    (413, "body-size"): "a body over the limit",
    (400, "content-type"): "a body not sent as application/json, with one Content-Type header",
    (421, "host"): "a Host header this listener does not answer to (DNS rebinding)",
    (429, "connections"): "a peer, or the listener, past its bound of connections",
    (429, "streams"): "event streams (GET /mcp) past their bound",
}
# Why the listener closed a connection itself: an answer its client did not take, an idle one closed for room.
HTTP_DROPS: tuple[str, ...] = ("write-timeout", "evicted")

# A converged pass is tens of milliseconds; a pass with an enter waits minutes for health.
PASS_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1200)
# An enter waits for health up to the recipe's start timeout (the seed's TP=2 enter took 234 s).
# A reclaim waits confirm_interval_s (2 s) between inspections; a leave up to the stop timeout (180 s).
ACTION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200)
# A label value is a line of text, not a log: long loader errors are cut here.
MAX_ERROR_LABEL = 300


@dataclass(frozen=True)
class SlotOwner:
    """One holder of a GPU slot as exported by ``reconciler_gpu_owner_info``."""

    owner: str  # one of OWNER_KINDS
    recipe: str = ""
    container: str = ""


def gpu_owners(observed: Observed, host: HostConfig | None = None) -> dict[str, tuple[SlotOwner, ...]]:
    """Who holds each GPU slot: containers (by our label or their device requests) and bare GPU processes.

    Pure. Uses the planner's ``claimed_slots`` so metrics and plan agree on who holds what. A slot nobody
    holds gets one ``free`` entry. With ``gpu_telemetry: none`` bare processes are invisible, so "free" then
    means "no container claims it".
    """
    slots: list[str] = list(host.gpus) if host is not None else []
    slots += [s for s in observed.gpus.slots if s not in slots]
    ids = slot_ids(host, observed)

    def describe(c: ContainerView) -> SlotOwner:
        ours = c.managed and c.labels.get(LABEL_HOST, observed.host) == observed.host
        if ours and owner_kind(c, observed.host, observed.ownership) != "copied":
            return SlotOwner("managed", c.recipe or "", c.name)
        return SlotOwner("unmanaged", "", c.name)

    found: dict[str, list[SlotOwner]] = {s: [] for s in slots}
    all_slots = tuple(slots)
    for c in observed.containers:
        if not c.active:
            continue
        for slot in claimed_slots(c, ids, all_slots, host=observed.host):
            owner = describe(c)
            if slot in found and owner not in found[slot]:
                found[slot].append(owner)
    by_id = {c.id: c for c in observed.containers}
    for slot, view in observed.gpus.slots.items():
        for p in view.processes:
            ctr = by_id.get(p.container_id) if p.container_id else None
            if ctr is not None:
                owner = describe(ctr)
            elif p.container_id:
                # A container Docker did not list (created after the listing): name it by its short id.
                owner = SlotOwner("unmanaged", "", p.container_id[:12])
            else:
                owner = SlotOwner("process")
            if owner not in found[slot]:
                found[slot].append(owner)
    if host is not None and observed.gpus.telemetry == "nvml" and observed.gpus.source.ok:
        for slot, owners in found.items():
            # VRAM in use, no process listed, no container: held by something NVML does not show (WSL2).
            if not owners and unlisted_used_bytes(host, observed.gpus.slots.get(slot)) is not None:
                owners.append(SlotOwner("unlisted"))
    return {s: tuple(o) if o else (SlotOwner("free"),) for s, o in found.items()}


class Metrics:
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
        r = self.registry
        p = PREFIX

        self.build_info = Info(f"{p}_build", "Version of the reconciler and of the Python running it.", registry=r)
        self.host_info = Gauge(
            f"{p}_host_info",
            "Always 1; the host name from configs/host.yaml, its GPU telemetry and its offload shm dir.",
            ["host", "gpu_telemetry", "shm_dir"],
            registry=r,
        )
        self.start_time = Gauge(
            f"{p}_start_time_seconds", "Unix time this reconciler process started its metrics.", registry=r
        )

        # ---- passes
        self.passes = Counter(
            f"{p}_reconcile_passes",
            "Reconcile passes by how they ended (converged|changed|blocked|failed|error).",
            ["result"],
            registry=r,
        )
        self.pass_duration = Histogram(
            f"{p}_reconcile_duration_seconds",
            "Wall time of one reconcile pass (load, observe, plan, apply), by result.",
            ["result"],
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self.last_pass = Gauge(
            f"{p}_last_pass_timestamp_seconds",
            "Unix time the last reconcile pass ended, whatever its result; 0 before the first.",
            registry=r,
        )
        self.last_success = Gauge(
            f"{p}_last_success_timestamp_seconds",
            "Unix time the last pass ended without failure (converged, changed or blocked); 0 before the first.",
            registry=r,
        )
        self.last_converged = Gauge(
            f"{p}_last_converged_timestamp_seconds",
            "Unix time the host was last seen matching the desired state; 0 before the first time.",
            registry=r,
        )
        self.consecutive_failures = Gauge(
            f"{p}_reconcile_consecutive_failures",
            "Passes in a row that ended failed or error; 0 after any success.",
            registry=r,
        )

        # ---- plan
        self.pending = Gauge(
            f"{p}_pending_actions",
            "Actions the latest plan wants to run, by kind (leave|reclaim|enter).",
            ["kind"],
            registry=r,
        )
        self.blocked = Gauge(
            f"{p}_blocked_changes",
            "Needed changes the latest plan cannot make safely (a GPU held by something not owned, no tmpfs room).",
            registry=r,
        )
        self.held = Gauge(
            f"{p}_held_assignments",
            "Assignments whose enter the latest plan postponed (recipe in backoff).",
            registry=r,
        )
        self.fallback = Gauge(
            f"{p}_fallback_active",
            "1 for each lane of the last converged topology brought back on the slots of a held lane (in backoff) "
            "until that lane's next attempt.",
            ["recipe", "slots", "instead_of"],
            registry=r,
        )
        self.fallback_next_attempt = Gauge(
            f"{p}_fallback_next_attempt_seconds",
            "Seconds until the held lane a fallback stands in for is tried again (as of the latest pass).",
            ["recipe", "slots", "instead_of"],
            registry=r,
        )
        self._fallback_labels: set[tuple[str, str, str]] = set()
        self.drift = Gauge(
            f"{p}_drift",
            "1 when the host is not known to match the desired state (actions, blockers, held enters or a source "
            "down); 0 when converged.",
            registry=r,
        )

        # ---- actions
        self.actions = Counter(
            f"{p}_actions",
            "Actions run by the apply layer, by kind (leave|reclaim|enter) and result (ok|failed|refused).",
            ["kind", "result"],
            registry=r,
        )
        self.action_duration = Histogram(
            f"{p}_action_duration_seconds",
            "Wall time of one action from preflight to postcondition, by kind and result.",
            ["kind", "result"],
            buckets=ACTION_BUCKETS,
            registry=r,
        )
        self.slot_dark = Histogram(
            f"{p}_slot_dark_seconds",
            "How long a GPU slot served nothing in a switch: from its old lane's stop (or the enter's start, on a "
            "slot that was free) until its new lane passed its health check and probes, by slot.",
            ["slot"],
            buckets=ACTION_BUCKETS,
            registry=r,
        )
        self.reclaimed = Counter(
            f"{p}_reclaimed_bytes", "Bytes of orphan offload files deleted (allocated tmpfs bytes freed).", registry=r
        )
        self.refusals = Counter(
            f"{p}_refusals",
            "Times the apply layer refused to act, by reason (a fixed set, one per safety rule).",
            ["reason"],
            registry=r,
        )
        self.http_refusals = Counter(
            f"{p}_http_refusals",
            "Requests and connections the HTTP listener refused, by the status answered and the reason (a fixed set).",
            ["status", "reason"],
            registry=r,
        )
        self.http_drops = Counter(
            f"{p}_http_connections_dropped",
            "Connections the HTTP listener closed itself: write-timeout (an answer its client did not take) or "
            "evicted (an idle one, for room).",
            ["reason"],
            registry=r,
        )
        self.listener_restarts = Counter(
            f"{p}_http_listener_restarts",
            "Times the HTTP listener (/metrics, /healthz, /v1, /mcp) stopped and was started again.",
            registry=r,
        )

        # ---- GPUs
        self.gpu_owner = Gauge(
            f"{p}_gpu_owner_info",
            "Always 1; who holds each GPU slot: owner is managed (this tool's container), unmanaged (another "
            "container), process (a GPU process in no container), unlisted (VRAM in use and no process listed) or free.",
            ["slot", "recipe", "container", "owner"],
            registry=r,
        )
        self.gpu_mem_used = Gauge(
            f"{p}_gpu_memory_used_bytes",
            "GPU memory in use per slot (absent when telemetry is none or unavailable).",
            ["slot"],
            registry=r,
        )
        self.gpu_mem_total = Gauge(
            f"{p}_gpu_memory_total_bytes",
            "GPU memory per slot (absent when telemetry is none or unavailable).",
            ["slot"],
            registry=r,
        )
        self.gpu_mem_free = Gauge(
            f"{p}_gpu_memory_free_bytes",
            "Free GPU memory per slot as the card reports it, sampled every pass (absent when telemetry is none or "
            "unavailable).",
            ["slot"],
            registry=r,
        )
        self.gpu_mem_reserve = Gauge(
            f"{p}_gpu_memory_reserve_bytes",
            "Free GPU memory each slot's card must keep once a lane is loaded (gpu_reserve.free_gib, or the slot's "
            "free_gib); absent where the free figure is not known.",
            ["slot"],
            registry=r,
        )
        self.gpu_below_reserve = Gauge(
            f"{p}_gpu_memory_below_reserve",
            "1 when a slot's free GPU memory is below its reserve, 0 when not; absent when not known.",
            ["slot"],
            registry=r,
        )
        self.gpu_mem_unlisted = Gauge(
            f"{p}_gpu_memory_unlisted_bytes",
            "GPU memory in use on a slot whose card lists no process, beyond its idle baseline (something NVML "
            "does not show holds it; 0 otherwise); absent when not known.",
            ["slot"],
            registry=r,
        )
        self.page_cache = Gauge(
            f"{p}_page_cache_bytes",
            "Cached bytes of /proc/meminfo around the last page-cache drop after a leave, when=before|after.",
            ["when"],
            registry=r,
        )
        self.page_cache_drops = Counter(
            f"{p}_page_cache_drops",
            "Page-cache drops after a leave by result (dropped|refused: the kernel said no|skipped: an enter "
            "was waiting for health).",
            ["result"],
            registry=r,
        )
        self.gpu_processes = Gauge(
            f"{p}_gpu_processes",
            "Compute processes on each slot's GPU (absent when telemetry is none or unavailable).",
            ["slot"],
            registry=r,
        )

        # ---- offload shm
        self.offload_files = Gauge(
            f"{p}_offload_files",
            "Offload files in shm.dir by state (owned|orphan|blocked; deleted: unlinked but still mapped).",
            ["state"],
            registry=r,
        )
        self.offload_bytes = Gauge(
            f"{p}_offload_bytes",
            "Allocated tmpfs bytes of offload files by state (owned|orphan|blocked|deleted).",
            ["state"],
            registry=r,
        )
        self.tmpfs_size = Gauge(f"{p}_tmpfs_size_bytes", "Size of the tmpfs holding shm.dir.", registry=r)
        self.tmpfs_free = Gauge(f"{p}_tmpfs_free_bytes", "Free bytes on the tmpfs holding shm.dir.", registry=r)
        self.uninspectable = Gauge(
            f"{p}_uninspectable_processes",
            "Processes whose maps or fds could not be read, by excused (true: in shm.ignore_uninspectable_pids).",
            ["excused"],
            registry=r,
        )

        # ---- sources and config
        self.source_up = Gauge(
            f"{p}_source_up",
            "1 when an observation source (docker|proc|gpu) answered completely in the last pass.",
            ["source"],
            registry=r,
        )
        self.source_state = Gauge(
            f"{p}_source_state",
            "1 for the state of each observation source in the last pass (ok|slow|down|error), 0 for the others: "
            "slow is an engine that did not answer within docker.timeout_s, down one that does not answer at all.",
            ["source", "state"],
            registry=r,
        )
        self.manifest_valid = Gauge(
            f"{p}_manifest_valid",
            "1 when configs/ and manifests/ loaded and validated; 0 while the loop keeps the last valid desired state.",
            registry=r,
        )
        self.manifest_error = Gauge(
            f"{p}_manifest_error_info",
            "Always 1 while the configuration is invalid; error is the first loader message.",
            ["error"],
            registry=r,
        )
        self.manifest_last_error = Gauge(
            f"{p}_manifest_last_error_timestamp_seconds",
            "Unix time a load last failed validation; 0 if never.",
            registry=r,
        )

        # ---- backoff
        self.backoff = Gauge(
            f"{p}_recipe_backoff",
            "1 while a recipe is in backoff after a failed enter; 0 otherwise.",
            ["recipe"],
            registry=r,
        )
        self.backoff_until = Gauge(
            f"{p}_recipe_backoff_until_timestamp_seconds",
            "Unix time before which a recipe in backoff is not entered again; 0 when not in backoff.",
            ["recipe"],
            registry=r,
        )
        self.backoff_failures = Gauge(
            f"{p}_recipe_enter_failures",
            "Failed enters of a recipe in a row; 0 after a successful enter or a reset.",
            ["recipe"],
            registry=r,
        )

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
            for name, src in observed.sources.items():
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

            telemetry_ok = observed.gpus.telemetry != "none" and observed.gpus.source.ok
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


class ProbeCollector:
    """The ``reconciler_probe_*`` families and free VRAM under load, from ``reconciler.store.probe_history`` at each
    collect: per probe its last result and duration, per suite its last run, per card its lowest free figure while
    the suite ran (labelled with the probe running then) and whether that was below the reserve."""

    def __init__(self, host: Callable[[], str | None], recipes: Callable[[], set[str]]):
        self._host = host
        self._recipes = recipes

    def describe(self) -> list:
        return []  # nothing to check at registration: the families depend on what ran

    def collect(self) -> Iterable:
        from prometheus_client.core import GaugeMetricFamily

        from reconciler.store.probe_history import last_suites

        p = PREFIX
        ok = GaugeMetricFamily(
            f"{p}_probe_success",
            "1 when the probe passed in the last run of its suite, 0 when it failed.",
            labels=["recipe", "suite", "probe", "kind"],
        )
        dur = GaugeMetricFamily(
            f"{p}_probe_duration_seconds",
            "How long the probe took in the last run of its suite.",
            labels=["recipe", "suite", "probe", "kind"],
        )
        suite_ok = GaugeMetricFamily(
            f"{p}_probe_suite_success",
            "1 when every probe of the suite passed in its "
            "last run (and the cards kept their reserve under enforce), 0 when not.",
            labels=["recipe", "suite"],
        )
        last = GaugeMetricFamily(
            f"{p}_probe_suite_last_run_timestamp_seconds",
            "Unix time the suite's last run started.",
            labels=["recipe", "suite"],
        )
        low = GaugeMetricFamily(
            f"{p}_gpu_memory_free_under_load_min_bytes",
            "The lowest free GPU memory of a "
            "lane's card while the suite last ran (NVML, sampled a few times a second), and the "
            "probe that was running then ('' between probes).",
            labels=["recipe", "suite", "slot", "probe"],
        )
        below = GaugeMetricFamily(
            f"{p}_gpu_memory_under_load_below_reserve",
            "1 when that lowest figure was below the card's free-VRAM reserve, 0 when not.",
            labels=["recipe", "suite", "slot"],
        )
        host = self._host()
        runs = last_suites(host, self._recipes() or None) if host else {}
        for recipe, suites in runs.items():
            for suite, run in suites.items():
                under = run.get("vram_under_load") or {}
                suite_ok.add_metric([recipe, suite], 1.0 if run.get("ok") and not under.get("failed") else 0.0)
                last.add_metric([recipe, suite], float(run.get("started") or 0))
                for pr in run.get("probes") or ():
                    labels = [recipe, suite, str(pr.get("name")), str(pr.get("kind"))]
                    ok.add_metric(labels, 1.0 if pr.get("ok") else 0.0)
                    dur.add_metric(labels, float(pr.get("seconds") or 0))
                for slot, fig in (under.get("slots") or {}).items():
                    low.add_metric([recipe, suite, slot, str(fig.get("probe") or "")], float(fig["min_free_bytes"]))
                    below.add_metric([recipe, suite, slot], 1.0 if fig.get("below_reserve") else 0.0)
        return [ok, dur, suite_ok, last, low, below]


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
    from reconciler.base.redact import redact_text

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
