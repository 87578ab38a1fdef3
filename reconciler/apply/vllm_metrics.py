"""vLLM's metrics, read from a lane's ``/metrics`` with prometheus-client's own text parser: the running and waiting
gauges a drain waits on, and the prefix cache's counters a ``batch`` probe reports.

Called by the apply layer (``read_gauges``, before a leave) and by ``reconciler.apply.probes`` (``read_prefix_cache``).
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.apply.lane_http import body_text, request
from reconciler.base import direct_http

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREFIX_QUERIES = "vllm:prefix_cache_queries"  # counters, in tokens (vLLM V1); *_total in the exposition
PREFIX_HITS = "vllm:prefix_cache_hits"


def parse_samples(text: str, names: Sequence[str]) -> dict[str, float] | None:
    """Each named metric's samples summed over every engine and model, from a Prometheus text exposition, by
    prometheus-client's own parser (a counter named with or without ``_total``). Only the names found are in the
    answer; None when the text is not an exposition at all."""
    # The start-up budget: prometheus_client (its package loads its HTTP exposition too) is imported by the first
    # exposition read, not by every command that imports the probes.
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names) | {f"{n}_total" for n in names}
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    key = sample.name.removesuffix("_total") if sample.name not in names else sample.name
                    sums[key] = sums.get(key, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):
        return None
    return sums


def parse_gauges(text: str) -> tuple[float, float] | None:
    """(running, waiting) summed over every engine and model; None when neither gauge is there (not a vLLM
    /metrics)."""
    sums = parse_samples(text, (RUNNING, WAITING))
    if not sums:
        return None
    return sums.get(RUNNING, 0.0), sums.get(WAITING, 0.0)


def _metrics_text(url: str, timeout: float) -> str:
    try:
        ans = request(url, None, timeout)
    except direct_http.errors() as exc:
        return f"!{url} did not answer ({getattr(exc, 'reason', exc)})"
    if ans.status != 200:
        return f"!{url} answered HTTP {ans.status}"
    return body_text(ans.body)


def read_gauges(url: str, *, timeout: float = 2.0) -> tuple[float, float] | str:
    """(running, waiting) from a lane's /metrics, or why they could not be read."""
    text = _metrics_text(url, timeout)
    if text.startswith("!"):
        return text[1:]
    gauges = parse_gauges(text)
    if gauges is None:
        return f"{url} has no {RUNNING} / {WAITING}"
    return gauges


def read_prefix_cache(url: str, *, timeout: float = 2.0) -> tuple[float, float] | None:
    """(queried, hit) prompt tokens of vLLM's prefix cache so far, or None where its /metrics does not show them."""
    text = _metrics_text(url, timeout)
    if text.startswith("!"):
        return None
    sums = parse_samples(text, (PREFIX_QUERIES, PREFIX_HITS))
    if not sums or PREFIX_QUERIES not in sums or PREFIX_HITS not in sums:
        return None
    return sums[PREFIX_QUERIES], sums[PREFIX_HITS]
