"""Functional probes: a recipe's ``[[probes]]`` run against its running lane, one by one or by suite.

Called by the apply layer (the ``preflight`` suite after the health URL answers, before an enter counts as done) and
by ``reconciler probe RECIPE [--suite S]`` through the service layer (the CLI, ``GET /v1/probe`` and the MCP tool
``host_probe``). Each probe's requests are built here and sent by ``reconciler.apply.lane_http`` (plain HTTP to the
lane's own port, never through a proxy); ``reconciler.apply.probe_answers`` judges each answer. A suite samples its
cards' free VRAM meanwhile.

Every probe reports what came back when it fails, cut to a readable length (``lane_http.SHOWN``); a probe never
raises for what the server does.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.apply.haystack import filler, make_haystack
from reconciler.apply.lane_http import request
from reconciler.apply.probe_answers import Check, judge
from reconciler.apply.vllm_metrics import read_prefix_cache
from reconciler.base import direct_http
from reconciler.base.units import percent
from reconciler.model import DesiredState, ProbeSpec, Recipe
from reconciler.observe.gpu import MemoryReader
from reconciler.plan.vram import SAMPLE_INTERVAL_S, LoadVerdict, VramSampler, load_reserve_verdict

DEFAULT_HAYSTACK_TOKENS = 8192
DEFAULT_DEPTH = 0.5
DEFAULT_BATCH = 20
DEFAULT_PREFIX_TOKENS = 4096


@dataclass(frozen=True)
class ProbeResult:
    name: str
    kind: str
    ok: bool
    seconds: float
    detail: str  # what was checked (ok) or what came back (failed)
    suite: str = "preflight"
    figures: dict[str, Any] = field(default_factory=dict)  # a needle's size and seed, a batch's N/N and latencies

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "kind": self.kind,
            "suite": self.suite,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }
        if self.figures:
            out["figures"] = self.figures
        return out

    def reason(self) -> str:
        return f"probe {self.name!r} ({self.kind}) failed: {self.detail}"


# ---------------------------------------------------------------- one request


def _tool_choice(probe: ProbeSpec) -> Any:
    choice = probe.tool_choice or "auto"
    return choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}


def _payload(
    probe: ProbeSpec, model: str, *, prompt: str | None = None, system: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The route and body of one request of ``probe`` (``prompt`` and ``system``: a batch's or needle's own)."""
    prompt = probe.prompt if prompt is None else prompt
    if probe.kind == "completion":
        body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": probe.max_tokens, "temperature": 0}
        if probe.stream:
            body["stream"] = True
        return "/v1/completions", body
    if probe.kind == "responses":
        body = {"model": model, "input": prompt, "max_output_tokens": probe.max_tokens, "temperature": 0}
        if probe.json_schema is not None:
            body["text"] = {
                "format": {
                    "type": "json_schema",
                    "name": _schema_name(probe),
                    "schema": probe.json_schema,
                    "strict": True,
                }
            }
        return "/v1/responses", body
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    body = {"model": model, "messages": messages, "max_tokens": probe.max_tokens, "temperature": 0}
    if probe.tools:
        body["tools"] = [t.to_openai() for t in probe.tools]
    if probe.kind in ("tools", "batch") and probe.tools:
        body["tool_choice"] = _tool_choice(probe)
    if probe.kind == "tool-result":
        call_id = "call_probe_0"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": probe.expected_call, "arguments": json.dumps(probe.arguments)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": probe.tool_result})
    if probe.stream:
        body["stream"] = True
    if probe.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": _schema_name(probe), "schema": probe.json_schema},
        }
    return "/v1/chat/completions", body


def _schema_name(probe: ProbeSpec) -> str:
    return probe.name.replace(".", "_").replace("-", "_")


def _ask(
    base: str, probe: ProbeSpec, path: str, payload: dict[str, Any] | None, check: Check, model: str
) -> tuple[bool, str, dict[str, Any], float]:
    t0 = time.monotonic()
    try:
        ans = request(f"{base}{path}", payload, probe.timeout_s)
    except direct_http.errors() as exc:
        why = getattr(exc, "reason", exc)
        return False, f"no answer from {base} ({type(why).__name__}: {why})", {}, time.monotonic() - t0
    seconds = time.monotonic() - t0
    ok, detail, figures = judge(probe, ans, check, seconds, model)
    return ok, detail, figures, seconds


# ---------------------------------------------------------------- the probe kinds


def run_probe(probe: ProbeSpec, recipe: Recipe) -> ProbeResult:
    """One probe against the recipe's running lane; never raises for what the server does."""
    base = probe.base_url or recipe.api_origin() or ""
    model = probe.model or recipe.model.id
    t0 = time.monotonic()

    def result(ok: bool, detail: str, figures: dict[str, Any] | None = None) -> ProbeResult:
        return ProbeResult(probe.name, probe.kind, ok, time.monotonic() - t0, detail, probe.suite, figures or {})

    if probe.kind == "batch":
        return _run_batch(probe, recipe, base, model, result)
    if probe.kind == "models":
        ok, detail, figures, _ = _ask(base, probe, "/v1/models", None, Check(None, None), model)
        return result(ok, detail, figures)
    if probe.kind == "needle":
        tokens = probe.haystack_tokens or DEFAULT_HAYSTACK_TOKENS
        depth = DEFAULT_DEPTH if probe.depth is None else probe.depth
        seed = probe.seed or 0
        hay = make_haystack(seed=seed, tokens=tokens, depth=depth)
        path, payload = _payload(probe, model, prompt=f"{hay.text}\n\n{hay.question}")
        ok, detail, figures, _ = _ask(base, probe, path, payload, Check(hay.answer, None), model)
        figures = {"seed": seed, "haystack_tokens": tokens, "depth": depth, "words": hay.words, **figures}
        where = f"a {tokens}-token haystack (seed {seed}, depth {depth:g})"
        if ok:
            return result(True, f"found {hay.answer!r} in {where}; {detail}", figures)
        if "does not contain" in detail:
            detail = detail.replace(
                f"the answer does not contain {hay.answer!r}", f"the answer misses the needle {hay.answer!r}"
            )
        return result(False, f"{detail} ({where})", figures)
    path, payload = _payload(probe, model)
    ok, detail, figures, _ = _ask(base, probe, path, payload, Check(probe.contains, probe.matches), model)
    return result(ok, detail, figures)


def _percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by the nearest-rank method: always one of the measured values."""
    ordered = sorted(values)
    k = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(k) - 1]


def _run_batch(
    probe: ProbeSpec, recipe: Recipe, base: str, model: str, result: Callable[..., ProbeResult]
) -> ProbeResult:
    """N requests at once behind one shared prefix; all must pass. Prefix-cache hits from vLLM's counters, read
    before and after, where its /metrics shows them."""
    n = probe.requests or DEFAULT_BATCH
    tokens = DEFAULT_PREFIX_TOKENS if probe.prefix_tokens is None else probe.prefix_tokens
    seed = probe.seed or 0
    prefix = " ".join(filler(random.Random(seed), tokens)) if tokens else None
    if prefix:
        prefix = "Read this document; the questions after it are about other things.\n\n" + prefix
    metrics_url = recipe.drain_metrics_url()
    before = read_prefix_cache(metrics_url) if metrics_url else None
    outcomes: list[tuple[bool, str, float] | None] = [None] * n
    gate = threading.Barrier(n)

    def one(i: int) -> None:
        fill = str(i + 1)
        check = Check(
            probe.contains.replace("{i}", fill) if probe.contains else None,
            probe.matches.replace("{i}", fill) if probe.matches else None,
        )
        path, payload = _payload(probe, model, prompt=(probe.prompt or "").replace("{i}", fill), system=prefix)
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait(timeout=10)  # all N leave together: the engine sees them at once, as the report's batch did
        ok, detail, _figures, seconds = _ask(base, probe, path, payload, check, model)
        outcomes[i] = (ok, detail, seconds)

    threads = [
        threading.Thread(target=one, args=(i,), daemon=True, name=f"probe-{probe.name}-{i + 1}") for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [o if o is not None else (False, "the request's thread ended without an answer", 0.0) for o in outcomes]
    passed = sum(1 for ok, _, _ in done if ok)
    latencies = [s for _, _, s in done]
    figures: dict[str, Any] = {
        "requests": n,
        "passed": passed,
        "prefix_tokens": tokens,
        "seed": seed,
        "p50_s": round(_percentile(latencies, 50), 3),
        "p95_s": round(_percentile(latencies, 95), 3),
    }
    after = read_prefix_cache(metrics_url) if metrics_url and before is not None else None
    cache = ""
    if before is not None and after is not None:
        queries, hits = after[0] - before[0], after[1] - before[1]
        figures["prefix_cache"] = {"queries_tokens": int(queries), "hits_tokens": int(hits)}
        if queries > 0:
            cache = f", prefix cache {int(hits)} of {int(queries)} prompt tokens hit ({percent(hits, queries)})"
    summary = f"{passed}/{n} passed, p50 {figures['p50_s']:.2f} s, p95 {figures['p95_s']:.2f} s{cache}"
    failed = [(i + 1, d) for i, (ok, d, _) in enumerate(done) if not ok]
    if failed:
        first, why = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return result(False, f"{summary}; request {first} failed{more}: {why}", figures)
    return result(True, summary, figures)


@dataclass
class SuiteRun:
    """One run of a recipe's suite: each probe's result, and its cards' free VRAM at their lowest meanwhile."""

    recipe: str
    suite: str
    planned: int  # probes in the suite; fewer results when it stopped at a failure or was cancelled
    results: list[ProbeResult]
    started: float  # Unix time
    seconds: float
    vram: LoadVerdict

    @property
    def ok(self) -> bool:
        return len(self.results) == self.planned and all(r.ok for r in self.results)

    @property
    def first_failure(self) -> ProbeResult | None:
        return next((r for r in self.results if not r.ok), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "suite": self.suite,
            "ok": self.ok,
            "planned": self.planned,
            "passed": sum(r.ok for r in self.results),
            "started": round(self.started, 3),
            "seconds": round(self.seconds, 3),
            "probes": [r.to_json() for r in self.results],
            "vram_under_load": self.vram.to_json(),
        }


def run_suite(
    desired: DesiredState,
    recipe: str,
    suite: str,
    *,
    slots: tuple[str, ...] = (),
    before: Callable[[ProbeSpec, int, int], None] | None = None,
    stop_at_failure: bool = False,
    interval_s: float = SAMPLE_INTERVAL_S,
) -> SuiteRun:
    """``suite`` of ``recipe`` (``preflight``, ``regression`` or ``all``), its probes in order, while the free VRAM
    of ``slots`` is sampled (NVML, every ``interval_s``; nothing with ``gpu_telemetry: none`` or no slots).
    ``before(probe, i, n)`` is called as each probe starts (progress; it may raise to stop the suite).
    ``stop_at_failure``: an enter's preflight, whose first failure fails it."""
    r = desired.recipes[recipe]
    probes = r.suite(suite)
    read: Callable[[], Any] | None = None
    with contextlib.ExitStack() as stack:
        if desired.host.gpu_telemetry == "nvml" and slots and probes:
            try:
                read = stack.enter_context(MemoryReader(desired.host, slots))
            except Exception as exc:  # noqa: BLE001 - NVML missing or failing: every sample fails, said as such
                why = f"NVML: {type(exc).__name__}: {exc}"

                def read() -> Any:
                    raise RuntimeError(why)

        sampler = VramSampler(read, interval_s=interval_s)
        started, t0 = time.time(), time.monotonic()
        results: list[ProbeResult] = []
        with sampler:
            for i, probe in enumerate(probes):
                sampler.running(probe.name)
                if before is not None:
                    before(probe, i, len(probes))
                res = run_probe(probe, r)
                results.append(res)
                if stop_at_failure and not res.ok:
                    break
    verdict = load_reserve_verdict(desired, recipe, suite, sampler, tuple(slots) if probes else ())
    return SuiteRun(recipe, suite, len(probes), results, started, time.monotonic() - t0, verdict)
