"""What a running lane's own server says of itself: vLLM's release (``GET /version``) and its gauges on ``/metrics``
(requests running and waiting, KV cache usage, the offload connector's store and load bytes, the sleep state).

A read (``read_lane``: two plain HTTP GETs to the lane's own port, never through a proxy) and a pure parse
(``parse_version``, ``parse_lane_metrics``) tested on captured text. Read by ``reconciler status`` (service/status.py)
and by the loop's pass for the ``reconciler_lane_*`` metrics. A lane that does not answer is reported with why,
never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.base import direct_http
from reconciler.model import DesiredState
from reconciler.plan.claims import owner_kind
from reconciler.plan.observed import Observed

# vLLM's name -> the key the reconciler reports it under (reconciler_lane_<key>). Counters are read with or without
# their _total suffix; vllm:kv_cache_usage_perc is a fraction (0..1) despite its name.
LANE_GAUGES: Mapping[str, str] = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_ratio",
    "vllm:kv_offload_store_bytes": "offload_store_bytes",
    "vllm:kv_offload_load_bytes": "offload_load_bytes",
}
# Releases before the flat counters above (and beside them, deprecated, in later ones) count both directions in one
# counter labelled by transfer_type: read only where the flat one is absent, so one transfer is never counted twice.
LEGACY_OFFLOAD = "vllm:kv_offload_total_bytes"
LEGACY_DIRECTIONS: Mapping[str, str] = {"gpu_to_cpu": "offload_store_bytes", "cpu_to_gpu": "offload_load_bytes"}
SLEEP_STATE = "vllm:engine_sleep_state"
GAUGE_KEYS = (*LANE_GAUGES.values(), "sleeping")  # one sample per sleep_state label, 1 for the state in force
TIMEOUT_S = 1.0


@dataclass(frozen=True)
class LaneReading:
    """One running lane of this install, as its server answered."""

    container: str
    recipe: str
    slots: tuple[str, ...]
    version: str | None = None
    gauges: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Every gauge's key, null where the lane's /metrics does not show it (a fixed shape for clients)."""
        return {"version": self.version, "gauges": {k: self.gauges.get(k) for k in GAUGE_KEYS}, "error": self.error}


def parse_version(body: bytes) -> str | None:
    """vLLM's ``{"version": "0.11.2"}``; None for anything else."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    v = doc.get("version") if isinstance(doc, dict) else None
    return v if isinstance(v, str) and v and len(v) <= 100 else None


def parse_lane_metrics(text: str) -> dict[str, float] | None:
    """The lane's gauges of LANE_GAUGES, each summed over its engines and models, and ``sleeping`` (1 when a
    sleep state other than awake is in force, 0 when awake is); only those found. None when the text is no
    Prometheus exposition at all."""
    # The start-up budget: prometheus_client is imported by the first exposition read (the loop's), not by every
    # command that imports this module for its names (status, an enter's version).
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {**LANE_GAUGES, **{f"{k}_total": v for k, v in LANE_GAUGES.items()}}
    out: dict[str, float] = {}
    legacy: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in wanted:
                    key = wanted[s.name]
                    out[key] = out.get(key, 0.0) + float(s.value)
                elif s.name in (LEGACY_OFFLOAD, f"{LEGACY_OFFLOAD}_total"):
                    key = LEGACY_DIRECTIONS.get(str(s.labels.get("transfer_type", "")).lower(), "")
                    if key:
                        legacy[key] = legacy.get(key, 0.0) + float(s.value)
                elif s.name == SLEEP_STATE and s.value == 1:
                    asleep = 0.0 if s.labels.get("sleep_state") == "awake" else 1.0
                    out["sleeping"] = max(out.get("sleeping", 0.0), asleep)
    except (ValueError, TypeError, IndexError):
        return None
    return {**legacy, **out}


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    import urllib.error  # on first use, as direct_http's opener (the start-up budget)
    import urllib.request

    req = urllib.request.Request(url, method="GET")  # noqa: S310 - the recipe's own URL: http(s) on loopback (model.check_probe_url)
    try:
        with direct_http.opener().open(req, timeout=timeout) as resp:
            return resp.status, resp.read(1 << 22)
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def read_lane(
    *, container: str, recipe: str, slots: tuple[str, ...], origin: str, metrics_url: str, timeout: float = TIMEOUT_S
) -> LaneReading:
    """Ask the lane at ``origin`` for its version and read its gauges from ``metrics_url``."""
    problems = []
    version = None
    gauges: dict[str, float] = {}
    try:
        status, body = _get(f"{origin}/version", timeout)
        version = parse_version(body) if status == 200 else None
        if status != 200:
            problems.append(f"{origin}/version answered HTTP {status}")
    except direct_http.errors() as exc:
        problems.append(f"{origin}/version did not answer ({getattr(exc, 'reason', exc)})")
    try:
        status, body = _get(metrics_url, timeout)
        parsed = parse_lane_metrics(body.decode("utf-8", "replace")) if status == 200 else None
        if parsed is None:
            problems.append(
                f"{metrics_url} answered HTTP {status}" if status != 200 else f"{metrics_url} is no exposition"
            )
        else:
            gauges = parsed
    except direct_http.errors() as exc:
        problems.append(f"{metrics_url} did not answer ({getattr(exc, 'reason', exc)})")
    return LaneReading(container, recipe, slots, version, gauges, "; ".join(problems) or None)


def read_lanes(lanes: Iterable[tuple[str, str, tuple[str, ...], str | None, str | None]]) -> list[LaneReading]:
    """Each (container, recipe, slots, origin, metrics_url) read in turn; a lane without an origin (its recipe has
    no health.url) is reported as such."""
    out = []
    for container, recipe, slots, origin, metrics_url in lanes:
        if not origin or not metrics_url:
            out.append(LaneReading(container, recipe, slots, error="its recipe has no health.url to ask"))
        else:
            out.append(
                read_lane(container=container, recipe=recipe, slots=slots, origin=origin, metrics_url=metrics_url)
            )
    return out


def lane_readings(desired: DesiredState, observed: Observed) -> dict[str, LaneReading]:
    """What each running lane of this install says of itself, by container name: asked at its recipe's origin
    (health.url) and read from its drain metrics URL (by default that origin's /metrics)."""
    lanes = []
    for c in observed.containers:
        recipe = desired.recipes.get(c.recipe or "")
        if c.state != "running" or recipe is None or owner_kind(c, desired.host.name, observed.ownership) != "ours":
            continue
        lanes.append((c.name, c.recipe or "", tuple(c.slots), recipe.api_origin(), recipe.drain_metrics_url()))
    return {r.container: r for r in read_lanes(lanes)}
