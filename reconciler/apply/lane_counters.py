"""A lane's own counters under vLLM's names, read from its ``/metrics`` before and after each step of a qualification:
the GPU prefix cache, the offload connector's prefix cache and transfers, speculative decoding, and the GPU tier's
size. A counter the lane does not export is absent from the reading (reported as not exported), never guessed as 0.

The names, each from vLLM's own source (docs/design.md, "Qualification"):

- ``vllm/v1/metrics/loggers.py``: ``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits`` (the GPU tier, in
  tokens), ``vllm:external_prefix_cache_queries``, ``vllm:external_prefix_cache_hits`` (the KV connector's, in tokens),
  and the info gauge ``vllm:cache_config_info`` whose labels ``num_gpu_blocks`` and ``block_size`` size the GPU tier;
- ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py`` (``OffloadPromMetrics``):
  ``vllm:kv_offload_total_bytes`` and ``vllm:kv_offload_total_time`` by ``transfer_type`` ``GPU_to_CPU`` and
  ``CPU_to_GPU``;
- ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingProm``): ``vllm:spec_decode_num_drafts``,
  ``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``.

Called by ``reconciler.apply.ladder``. A read (``read_counters``) and a pure parse (``parse_counters``).
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.apply.lane_http import body_text, request
from reconciler.base import direct_http

# key -> (vLLM's metric name, the transfer_type label it must carry, or None)
COUNTERS: Mapping[str, tuple[str, str | None]] = {
    "prefix_queries_tokens": ("vllm:prefix_cache_queries", None),
    "gpu_prefix_hits_tokens": ("vllm:prefix_cache_hits", None),
    "external_queries_tokens": ("vllm:external_prefix_cache_queries", None),
    "external_hits_tokens": ("vllm:external_prefix_cache_hits", None),
    "gpu_to_cpu_bytes": ("vllm:kv_offload_total_bytes", "GPU_to_CPU"),
    "cpu_to_gpu_bytes": ("vllm:kv_offload_total_bytes", "CPU_to_GPU"),
    "gpu_to_cpu_seconds": ("vllm:kv_offload_total_time", "GPU_to_CPU"),
    "cpu_to_gpu_seconds": ("vllm:kv_offload_total_time", "CPU_to_GPU"),
    "spec_drafts": ("vllm:spec_decode_num_drafts", None),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens", None),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", None),
}
CACHE_CONFIG = "vllm:cache_config_info"
GPU_TIER_KEY = "gpu_tier_tokens"  # num_gpu_blocks * block_size, from CACHE_CONFIG's labels


def source_of(key: str) -> str:
    """The counter a key stands for, as the record names its source: ``vllm:kv_offload_total_bytes{transfer_type=
    "CPU_to_GPU"}``."""
    if key == GPU_TIER_KEY:
        return f"{CACHE_CONFIG} num_gpu_blocks x block_size"
    name, label = COUNTERS[key]
    return f'{name}{{transfer_type="{label}"}}' if label else name


def parse_counters(text: str) -> dict[str, float] | None:
    """Each counter of COUNTERS the exposition shows, summed over engines and models (with or without ``_total``),
    and the GPU tier's size in tokens where ``vllm:cache_config_info`` says it; only those found. None when the
    text is no Prometheus exposition at all."""
    # The start-up budget: prometheus_client is imported by the first exposition read.
    from prometheus_client.parser import text_string_to_metric_families

    by_name: dict[tuple[str, str | None], str] = {}
    for key, (name, label) in COUNTERS.items():
        by_name[(name, label)] = key
        by_name[(f"{name}_total", label)] = key
    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == CACHE_CONFIG:
                    blocks, size = s.labels.get("num_gpu_blocks", ""), s.labels.get("block_size", "")
                    if blocks.isdigit() and size.isdigit():
                        out[GPU_TIER_KEY] = out.get(GPU_TIER_KEY, 0.0) + int(blocks) * int(size)
                    continue
                found = by_name.get((s.name, s.labels.get("transfer_type")))
                if found is not None:
                    out[found] = out.get(found, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError):
        return None
    return out


def read_counters(url: str, *, timeout: float = 5.0) -> dict[str, float] | str:
    """The lane's counters now, or why its /metrics could not be read."""
    try:
        ans = request(url, None, timeout)
    except direct_http.errors() as exc:
        return f"{url} did not answer ({getattr(exc, 'reason', exc)})"
    if ans.status != 200:
        return f"{url} answered HTTP {ans.status}"
    parsed = parse_counters(body_text(ans.body))
    return parsed if parsed is not None else f"{url} is no Prometheus exposition"


def delta(before: Mapping[str, float], after: Mapping[str, float], key: str) -> float | None:
    """How much a counter moved, or None where either reading lacks it (not exported)."""
    if key not in before or key not in after:
        return None
    return after[key] - before[key]
