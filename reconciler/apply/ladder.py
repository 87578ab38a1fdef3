"""The qualification's measurements against a running lane: the context ladder (one cold, streamed request per rung,
a distinct haystack each) and the offload reload proof (distinct long prompts until the lane's own counters say
request zero's prefix left the GPU tier, then its replay), each with the lane's counters before and after.

Called by ``reconciler.service.qualify``. Requests go to the lane's own port (``reconciler.apply.lane_http``'s
rules: plain HTTP, never through a proxy); the counters are read by ``reconciler.apply.lane_counters``. What each
figure means, where it comes from and what it does not prove: docs/design.md, "Qualification". Nothing here raises
for what the server does: a failed request is a figure with its error.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.apply.haystack import make_haystack
from reconciler.apply.lane_counters import COUNTERS, GPU_TIER_KEY, delta, read_counters, source_of
from reconciler.base import direct_http

MAX_TOKENS = 512  # the answer: reasoning and the code, and enough tokens to time the decode
RELOAD_MAX_PROMPTS = 12  # distinct prompts sent at most before the replay, where the counters never say "evicted"
REQUEST_TIMEOUT_S = 1800.0  # a 250K prompt at a few thousand tokens a second is minutes; a read waits this long


@dataclass
class StreamFigures:
    """One streamed request as the client saw it. Times are seconds from sending the request; tokens are the
    server's own count (``usage``), None where it gave none."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    ttfo_s: float | None = None  # the first delta of any kind (reasoning included)
    ttft_s: float | None = None  # the first content delta (first-visible)
    last_s: float | None = None
    e2e_s: float | None = None
    answer: str = ""
    error: str | None = None

    @property
    def prefill_tok_s(self) -> float | None:
        """Effective prefill: prompt tokens over the time to the first output (cached ones included, as the
        report's figure is)."""
        if self.prompt_tokens is None or not self.ttfo_s:
            return None
        return self.prompt_tokens / self.ttfo_s

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the time from the first output to the last."""
        if not self.completion_tokens or self.completion_tokens < 2 or self.ttfo_s is None or self.last_s is None:
            return None
        span = self.last_s - self.ttfo_s
        return (self.completion_tokens - 1) / span if span > 0 else None

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 3) -> float | None:
            return None if x is None else round(x, n)

        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttfo_s": r(self.ttfo_s),
            "ttft_s": r(self.ttft_s),
            "prefill_tok_s": r(self.prefill_tok_s, 1),
            "decode_tok_s": r(self.decode_tok_s, 1),
            "e2e_s": r(self.e2e_s),
            "error": self.error,
        }


def _delta_kind(delta: Mapping[str, Any]) -> str | None:
    """What a chat delta carries: reasoning (vLLM's ``reasoning``, earlier ``reasoning_content``), content, a tool
    call, or nothing (the role chunk)."""
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return "reasoning"
    if delta.get("content"):
        return "content"
    if delta.get("tool_calls"):
        return "tool"
    return None


def read_stream(lines: Any, t0: float, clock: Callable[[], float] = time.monotonic) -> StreamFigures:
    """Pure but for the clock: the figures of a server-sent-event stream of chat chunks, each line as it arrives."""
    fig = StreamFigures()
    parts: list[str] = []
    for raw in lines:
        line = raw.strip() if isinstance(raw, bytes) else raw.encode().strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        now = clock() - t0
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            fig.error = "a chunk of the stream is not JSON"
            continue
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if isinstance(usage, dict):
            fig.prompt_tokens = _int(usage.get("prompt_tokens"))
            fig.completion_tokens = _int(usage.get("completion_tokens"))
            details = usage.get("prompt_tokens_details")
            fig.cached_tokens = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            kind = _delta_kind(delta) if isinstance(delta, dict) else None
            if kind is None:
                continue
            if fig.ttfo_s is None:
                fig.ttfo_s = now
            if kind == "content":
                if fig.ttft_s is None:
                    fig.ttft_s = now
                parts.append(str(delta["content"]))  # type: ignore[index]
            fig.last_s = now
    fig.e2e_s = clock() - t0
    fig.answer = "".join(parts)
    return fig


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def stream_chat(
    base: str, model: str, prompt: str, *, max_tokens: int = MAX_TOKENS, timeout: float = REQUEST_TIMEOUT_S
) -> StreamFigures:
    """One streamed chat request with usage asked for (``stream_options.include_usage``), timed as it arrives."""
    import urllib.error  # on first use, as lane_http's (the start-up budget)
    import urllib.request

    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(  # noqa: S310 - the recipe's own URL: http(s) on loopback (model.check_probe_url)
        f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.monotonic()
    try:
        with direct_http.opener().open(req, timeout=timeout) as resp:
            return read_stream(resp, t0)
    except urllib.error.HTTPError as exc:
        text = exc.read(300).decode("utf-8", "replace") if exc.fp else ""
        return StreamFigures(e2e_s=time.monotonic() - t0, error=f"HTTP {exc.code}: {text.strip()[:200]}")
    except direct_http.errors() as exc:
        why = getattr(exc, "reason", exc)
        return StreamFigures(e2e_s=time.monotonic() - t0, error=f"no answer from {base} ({type(why).__name__}: {why})")


@dataclass
class Counters:
    """The lane's counters before and after a step (``before``/``after`` per key; a key absent: not exported)."""

    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        keys = [*COUNTERS, GPU_TIER_KEY]
        out: dict[str, Any] = {}
        for k in keys:
            if k in self.before or k in self.after:
                out[k] = {"before": self.before.get(k), "after": self.after.get(k), "source": source_of(k)}
        return {"values": out, "not_exported": [source_of(k) for k in keys if k not in out], "error": self.error}

    def moved(self, key: str) -> float | None:
        return delta(self.before, self.after, key)


def _read(url: str | None) -> tuple[dict[str, float], str | None]:
    if not url:
        return {}, "the recipe has no health.url, so no /metrics to read"
    got = read_counters(url)
    return (got, None) if isinstance(got, dict) else ({}, got)


def measured(url: str | None, step: Callable[[], Any]) -> tuple[Any, Counters]:
    """Run ``step`` between two readings of the lane's counters."""
    before, err = _read(url)
    out = step()
    after, err2 = _read(url)
    return out, Counters(before, after, err or err2)


def rung_prompt(seed: int, tokens: int) -> tuple[str, str]:
    """A haystack of about ``tokens`` tokens from ``seed`` (as the needle probe builds it) with its question, and
    the answer it hides."""
    hay = make_haystack(seed=seed, tokens=tokens, depth=0.5)
    return f"{hay.text}\n\n{hay.question}", hay.answer


def run_rung(base: str, model: str, metrics_url: str | None, *, target: int, seed: int) -> dict[str, Any]:
    """One cold rung: a distinct haystack of about ``target`` tokens, its figures and the counters around it."""
    prompt, answer = rung_prompt(seed, target)
    fig, counters = measured(metrics_url, lambda: stream_chat(base, model, prompt))
    return {
        "target_tokens": target,
        "seed": seed,
        **fig.to_json(),
        "answer_ok": answer in fig.answer,
        "counters": counters.to_json(),
    }


def new_seed() -> int:
    """A seed no earlier run used, so a rung is never served from the cache a previous run left."""
    return random.SystemRandom().randrange(1, 2**31)


def run_reload(
    base: str, model: str, metrics_url: str | None, *, tokens: int, seed: int, max_prompts: int = RELOAD_MAX_PROMPTS
) -> dict[str, Any]:
    """Request zero, then distinct prompts of ``tokens`` until the prompt tokens queried since it passed the GPU
    tier's size (``vllm:cache_config_info``) or ``max_prompts`` were sent; then the replay of request zero with the
    counters before and after it. ``proven``: the replay's external hits and CPU-to-GPU bytes rose while its GPU
    prefix hits did not."""
    zero_prompt, _answer = rung_prompt(seed, tokens)
    zero, zero_counters = measured(metrics_url, lambda: stream_chat(base, model, zero_prompt))
    tier = zero_counters.after.get(GPU_TIER_KEY)
    start = zero_counters.before.get("prefix_queries_tokens")
    sent: list[dict[str, Any]] = []
    why = ""
    while len(sent) < max_prompts:
        fig = stream_chat(base, model, rung_prompt(seed + 1 + len(sent), tokens)[0])
        sent.append({"seed": seed + 1 + len(sent), **fig.to_json()})
        if fig.error:
            why = f"an eviction prompt failed: {fig.error}"
            break
        now, _ = _read(metrics_url)
        queried = now.get("prefix_queries_tokens")
        if tier is not None and start is not None and queried is not None and queried - start > tier + tokens:
            why = (
                f"{int(queried - start):,} prompt tokens queried since request zero, past the GPU tier's "
                f"{int(tier):,} ({source_of(GPU_TIER_KEY)})"
            )
            break
    else:
        why = f"{max_prompts} distinct prompts sent; the lane does not say its GPU tier's size"
    replay, counters = measured(metrics_url, lambda: stream_chat(base, model, zero_prompt))
    ext, moved_bytes, gpu = (
        counters.moved("external_hits_tokens"),
        counters.moved("cpu_to_gpu_bytes"),
        counters.moved("gpu_prefix_hits_tokens"),
    )
    proven = bool(ext and ext > 0 and moved_bytes and moved_bytes > 0 and gpu == 0 and not replay.error)
    return {
        "tokens": tokens,
        "seed": seed,
        "request_zero": zero.to_json(),
        "eviction_prompts": sent,
        "evicted_because": why,
        "replay": replay.to_json(),
        "counters": counters.to_json(),
        "proven": proven,
        **{k: _pair(counters, k) for k in ("external_hits_tokens", "cpu_to_gpu_bytes", "cpu_to_gpu_seconds")},
        "gpu_prefix_hits_tokens": _pair(counters, "gpu_prefix_hits_tokens"),
        "prefix_queries_tokens": _pair(counters, "prefix_queries_tokens"),
    }


def _pair(c: Counters, key: str) -> dict[str, float | None] | None:
    """``{before, after}`` of one counter, None where the lane does not export it."""
    if key not in c.before and key not in c.after:
        return None
    return {"before": c.before.get(key), "after": c.after.get(key)}
