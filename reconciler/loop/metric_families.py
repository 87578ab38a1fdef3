"""The metric families the loop exports on ``/metrics``: their names, help texts, labels and buckets, and the label
values known in advance (pass results, action kinds and results, refusal reasons, sources, offload states).

Defines; does not update. ``reconciler.loop.metrics.Metrics`` builds on ``MetricFamilies`` and keeps them current;
tests and the bench take the label sets from here to check every series is exported.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from reconciler.plan.actions import ActionKind

PREFIX = "reconciler"

# How a reconcile pass ended. converged: nothing to do; changed: actions ran and all succeeded (or an enter was
# superseded by an edit, and the next pass plans it at once); blocked: a
# change is needed but cannot be made safely (or is held by backoff); failed: an action failed; error: the
# pass itself could not run (load, observe or an unexpected exception).
PASS_RESULTS: tuple[str, ...] = ("converged", "changed", "blocked", "failed", "error")
# Passes that completed without a failure: they move the last-success timestamp.
SUCCESS_RESULTS = frozenset({"converged", "changed", "blocked"})
ACTION_KINDS: tuple[str, ...] = tuple(k.value for k in ActionKind)
# ok: postcondition held; failed: the action ran and did not reach its postcondition; refused: a preflight
# check said no (the reason goes to record_refusal); superseded: an enter abandoned while it waited for health, an
# edit having left its lane unwanted.
ACTION_RESULTS: tuple[str, ...] = ("ok", "failed", "refused", "superseded")
PAGE_CACHE_RESULTS: tuple[str, ...] = ("dropped", "refused", "skipped")
# The lane's own gauges re-exported as reconciler_lane_<key> (observe/lanes.py LANE_GAUGES); absent while the lane's
# /metrics does not show one. The offload bytes are the lane's counters as last read. Its sleep state is
# reconciler_lane_sleeping{recipe,slots}, from its own GET /is_sleeping (sleeping lanes rule 3), not from here.
LANE_GAUGE_HELP: dict[str, str] = {
    "requests_running": "Requests the lane's engine runs now (vllm:num_requests_running).",
    "requests_waiting": "Requests waiting in the lane's queue (vllm:num_requests_waiting).",
    "kv_cache_usage_ratio": "The lane's KV cache in use, 0 to 1 (vllm:kv_cache_usage_perc).",
    "offload_store_bytes": "Bytes the lane stored to its offload medium so far (vllm:kv_offload_store_bytes).",
    "offload_load_bytes": "Bytes the lane loaded back from its offload medium so far (vllm:kv_offload_load_bytes).",
}
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
    "lane_awake": "a wake found another lane on its cards not asleep by its own answer, or its memory not free "
    "(Sleeping rule 1)",
}

# What the HTTP listener refuses, by the status answered and why (reconciler.api's Guard and its protocol).
HTTP_REFUSALS: Mapping[tuple[int, str], str] = {
    (400, "header"): "a header sent twice, or a Content-Length that is not a number",
    (400, "body-json"): "a body that is not strict JSON (a duplicate key, nested too deep, not JSON)",
    (401, "token"): "no bearer token, or a wrong one",
    (403, "origin"): "a web page of another origin",
    (403, "scope"): "the read token (or a session opened with it) on a route that changes something",
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


class MetricFamilies:
    """Every family of the reconciler's own metrics, registered on ``registry`` (a dedicated one, never the
    process-global registry). The probe families are collected at each scrape instead
    (``reconciler.loop.probe_metrics``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
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
        self.drift = Gauge(
            f"{p}_drift",
            "1 when the host is not known to match the desired state (actions, blockers, held enters or a source "
            "down); 0 when converged.",
            registry=r,
        )
        self.verdict = Gauge(
            f"{p}_verdict",
            "1 for the host's verdict as of the scrape, 0 for the others: converged, converging (actions pending or "
            "a pass acting), held (in backoff), blocked, unavailable (a source down), invalid (the files); the one "
            "the status page, /healthz and status give.",
            ["verdict"],
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
        self.lane_sleeping = Gauge(
            f"{p}_lane_sleeping",
            "1 while a lane of this tool says it sleeps (vLLM's sleep mode: its GET /is_sleeping), 0 while it says it "
            "is awake; no series for a lane without sleep mode or one that does not answer. Asleep is never serving.",
            ["recipe", "slots"],
            registry=r,
        )
        self.switch_seconds = Histogram(
            f"{p}_switch_seconds",
            "How long a lane took to serve once a pass brought it in: how=wake (a sleeping lane woken and probed) or "
            "how=cold (an enter from nothing: create, load, health, probes).",
            ["how"],
            buckets=ACTION_BUCKETS,
            registry=r,
        )
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

        # ---- each running lane's own server (observe/lanes.py): slot is the lane's slots, joined by ","
        self.lane_info = Gauge(
            f"{p}_lane_info",
            "1 for each running lane of this install, with the vLLM release its server gives (GET /version; "
            "empty when it gives none).",
            ["recipe", "slot", "vllm_version"],
            registry=r,
        )
        self.lane_up = Gauge(
            f"{p}_lane_up",
            "1 when the lane's /version and /metrics both answered at the last pass, else 0.",
            ["recipe", "slot"],
            registry=r,
        )
        self.lane_gauges = {
            key: Gauge(f"{p}_lane_{key}", help_text, ["recipe", "slot"], registry=r)
            for key, help_text in LANE_GAUGE_HELP.items()
        }

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

        # ---- the git source of the desired state (source: of the host file)
        self.git_commit = Gauge(
            f"{p}_git_commit_info",
            "Always 1 for the commit of the host's git source in use (commit: full hex, ref: the branch followed).",
            ["commit", "ref"],
            registry=r,
        )
        self.git_state = Gauge(
            f"{p}_git_state",
            "1 for the state of the host's git source, 0 for the others: following (the newest commit in use), "
            "waiting (for its canaries), stopped (a canary failed it), refused (its files do not validate), "
            "unreachable (the last fetch failed), unfetched.",
            ["state"],
            registry=r,
        )
        self.git_last_fetch = Gauge(
            f"{p}_git_last_fetch_timestamp_seconds",
            "Unix time the host's git source last answered a fetch; 0 if never.",
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


GIT_STATES = ("following", "waiting", "stopped", "refused", "unreachable", "unfetched")
