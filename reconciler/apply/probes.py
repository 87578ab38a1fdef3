"""Functional probes: a recipe's ``[[probes]]`` run against its running lane, by suite, and vLLM's gauges.

Called by the apply layer (the ``preflight`` suite after the health URL answers, before an enter counts as done; the
gauges before a leave, for the drain) and by ``reconciler probe RECIPE [--suite S]`` through the service layer (the
CLI, ``GET /v1/probe`` and the MCP tool ``host_probe``). Plain HTTP against the lane's own port on this host, never
through a proxy named in the environment (a proxy would answer, or fail, for a server it is not).

Every probe reports what came back when it fails, cut to a readable length (``_SHOWN``); a probe never raises for
what the server does. Answers are judged against the probe's JSON Schemas by ``jsonschema`` (imported on the first
schema check), and vLLM's ``/metrics`` is read with prometheus-client's own text parser.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.base import direct_http
from reconciler.model import DesiredState, ProbeSpec, Recipe
from reconciler.plan.vram import SAMPLE_INTERVAL_S, LoadVerdict, VramSampler, load_reserve_verdict

_SHOWN = 200  # characters of an answer quoted in a reason
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


def _quote(text: str) -> str:
    text = text.strip().replace("\n", " ")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def _body_text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


class _Answer:
    def __init__(self, status: int, body: bytes, ctype: str):
        self.status = status
        self.body = body
        self.ctype = ctype


def _request(url: str, payload: dict[str, Any] | None, timeout: float) -> _Answer:
    import urllib.error
    import urllib.request

    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")  # noqa: S310 - the recipe's own URL: http(s) on loopback (model.check_probe_url)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with direct_http.opener().open(req, timeout=timeout) as resp:
            return _Answer(resp.status, resp.read(), resp.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as exc:
        return _Answer(exc.code, exc.read(), exc.headers.get("Content-Type", "") if exc.headers else "")


# ---------------------------------------------------------------- JSON Schema, through jsonschema


def schema_violations(value: Any, schema: dict[str, Any], *, limit: int = 3) -> list[str]:
    """Where ``value`` breaks ``schema`` (draft 2020-12), each as ``$.path: message``; empty when it matches."""
    from jsonschema import Draft202012Validator

    out = []
    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    for err in errors[:limit]:
        at = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append(f"{at}: {err.message}")
    return out


# ---------------------------------------------------------------- server-sent events


@dataclass
class _Stream:
    text: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> id, name, arguments (reassembled)
    finished: str | None = None  # the last finish_reason
    done: bool = False  # 'data: [DONE]' came
    problem: str = ""


def _read_sse(body: bytes, *, chat: bool) -> _Stream:
    """An OpenAI server-sent event stream: its text and its tool calls, reassembled from the deltas."""
    s = _Stream()
    parts: list[str] = []
    for raw in _body_text(body).splitlines():
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            s.done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            s.problem = f"an event that is not JSON: {_quote(data)}"
            break
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            piece = delta.get("content") if chat else choice.get("text")
            if piece:
                parts.append(piece)
            for tc in delta.get("tool_calls") or ():
                call = s.calls.setdefault(int(tc.get("index") or 0), {"id": "", "name": "", "arguments": ""})
                fn = tc.get("function") or {}
                call["id"] = tc.get("id") or call["id"]
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                s.finished = choice["finish_reason"]
    s.text = "".join(parts)
    return s


def _calls_text(calls: Sequence[dict[str, str]]) -> str:
    return ", ".join(f"{c.get('name') or '?'}({c.get('arguments') or ''})" for c in calls) or "no tool call"


# ---------------------------------------------------------------- generated haystacks


# Common English words: in the BPE tokenizers of the report's models each is one token with its leading space, so a
# haystack of N words and periods is about N tokens (the server's own count comes back as prompt_tokens). None of
# them is a word of the needle, so the needle's sentence is the only one that answers its question.
_WORDS = (  # noqa: SIM905 - prose reads and edits better than two hundred quoted words
    "the a of and to in is was for on with as by at from that this it be are were or an but not have has had they "
    "their there which one all when we you he she his her so if out up about more some time into over after would "
    "could other than then them these two first new way may only also made like long many down day did get come "
    "make through back much before good year where most just any work well still old own last same great little "
    "right big high small large next early young important few public bad able river stone field morning garden "
    "window market winter summer music paper story water light house table letter road city hill forest village "
    "bridge island valley harbor train ship ocean mountain cloud rain snow wind sun moon star song book school "
    "teacher child friend family mother father brother sister doctor farmer baker painter walked carried opened "
    "watched wrote found kept brought held turned followed noticed quiet bright warm cold green blue red yellow"
).split()
_NEEDLE_ADJ = ("amber", "cobalt", "crimson", "silver", "golden", "violet", "scarlet", "ivory", "jade", "copper")
_NEEDLE_NOUN = ("falcon", "lantern", "compass", "harp", "anchor", "orchid", "glacier", "beacon", "quarry", "sextant")


@dataclass(frozen=True)
class Haystack:
    text: str  # the document, the needle inside it
    question: str
    answer: str  # what the answer must contain
    words: int
    needle_at: int  # the needle's position, in words from the start


def _filler(rng: random.Random, tokens: int) -> list[str]:
    """Sentences of 8 to 14 words until about ``tokens`` tokens (a word or a period each)."""
    out: list[str] = []
    count = 0
    while count < tokens:
        n = rng.randint(8, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + ".")
        count += n + 1
    return out


def make_haystack(*, seed: int, tokens: int, depth: float) -> Haystack:
    """A document of about ``tokens`` tokens from ``seed`` with one fact at ``depth`` (0 the start, 1 the end),
    and the question that only the fact answers. The same seed, size and depth make the same document."""
    rng = random.Random(seed)
    name = f"{rng.choice(_NEEDLE_ADJ)} {rng.choice(_NEEDLE_NOUN)}"
    code = f"{rng.randrange(10**6):06d}"
    needle = f"The secret code of the {name} vault is {code}."
    sentences = _filler(rng, max(0, tokens - len(needle.split()) - 1))
    at = round(depth * len(sentences))
    sentences.insert(at, needle)
    words_before = sum(len(s.split()) for s in sentences[:at])
    text = " ".join(sentences)
    question = f"What is the secret code of the {name} vault? Answer with the code only."
    return Haystack(text, question, code, len(text.split()), words_before)


# ---------------------------------------------------------------- one request, judged


@dataclass(frozen=True)
class _Check:
    """What one request's answer must show (a batch's request has its own, with ``{i}`` filled in)."""

    contains: str | None
    matches: str | None


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


def _judge(
    probe: ProbeSpec, ans: _Answer, check: _Check, seconds: float, model: str
) -> tuple[bool, str, dict[str, Any]]:
    """(passed, detail, figures) of one answer."""
    body = _body_text(ans.body)
    if ans.status != probe.status:
        return False, f"HTTP {ans.status}, expected {probe.status}: {_quote(body)}", {}
    if probe.status >= 300:
        return True, f"HTTP {ans.status} as expected in {seconds:.2f} s", {}
    figures: dict[str, Any] = {}
    if probe.kind == "models":
        try:
            ids = [m.get("id") for m in json.loads(ans.body).get("data") or ()]
        except (ValueError, AttributeError):
            return False, f"/v1/models answered something that is not a model list: {_quote(body)}", {}
        if model not in ids:
            return False, f"/v1/models lists {ids or 'no model'}, not {model!r}", {}
        return _latency(probe, seconds, f"/v1/models lists {model!r}")
    calls: list[dict[str, str]] = []
    text: str | None
    if probe.stream:
        if "text/event-stream" not in ans.ctype:
            return (
                False,
                (f"asked to stream, got {ans.ctype or 'no content type'}, not text/event-stream: {_quote(body)}"),
                {},
            )
        s = _read_sse(ans.body, chat=probe.kind != "completion")
        if s.problem:
            return False, s.problem, {}
        calls = [s.calls[i] for i in sorted(s.calls)]
        if not s.done or not s.finished:
            missing = " and ".join(
                w for w, gone in (("no finish_reason", not s.finished), ("no 'data: [DONE]'", not s.done)) if gone
            )
            if calls:
                return (
                    False,
                    (
                        f"the stream ended without closing its tool call ({missing}); reassembled so far: "
                        f"{_quote(_calls_text(calls))}"
                    ),
                    {},
                )
            return False, f"the stream ended without 'data: [DONE]' ({missing}; text so far {_quote(s.text)})", {}
        text = s.text
    elif probe.kind == "responses":
        try:
            doc = json.loads(ans.body)
            output = doc.get("output") or []
            parts = [
                c.get("text")
                for item in output
                if isinstance(item, dict) and item.get("type") == "message"
                for c in item.get("content") or ()
                if isinstance(c, dict) and c.get("type") == "output_text"
            ]
        except (ValueError, AttributeError, TypeError):
            return False, f"/v1/responses answered something that is not a Response: {_quote(body)}", {}
        texts = [t for t in parts if isinstance(t, str)]
        if not texts or not "".join(texts).strip():
            kinds = [item.get("type") for item in output if isinstance(item, dict)]
            return (
                False,
                (
                    f"the Responses answer has no output text (status {doc.get('status')!r}, output items "
                    f"{kinds or 'none'}): {_quote(body)}"
                ),
                {},
            )
        text = "".join(texts)
    else:
        try:
            doc = json.loads(ans.body)
            choice = (doc.get("choices") or [{}])[0]
            msg = choice.get("message") or {}
            text = msg.get("content") if probe.kind != "completion" else choice.get("text")
            calls = [
                {
                    "id": tc.get("id") or "",
                    "name": (tc.get("function") or {}).get("name") or "",
                    "arguments": (tc.get("function") or {}).get("arguments") or "",
                }
                for tc in msg.get("tool_calls") or ()
            ]
            usage = doc.get("usage") or {}
            if isinstance(usage.get("prompt_tokens"), int):
                figures["prompt_tokens"] = usage["prompt_tokens"]
        except (ValueError, AttributeError, IndexError, TypeError):
            return False, f"no completion in the answer: {_quote(body)}", {}
        if text is None and calls:
            text = ""
        if not isinstance(text, str):
            return False, f"no completion text in the answer: {_quote(body)}", figures
    if probe.tools and probe.kind in ("tools", "batch"):
        ok, detail = _judge_call(probe, calls, text, check)
        if not ok:
            return False, detail, figures
        return _latency(probe, seconds, detail, figures)
    if check.contains is not None and check.contains not in text:
        if probe.kind == "tool-result":
            return (
                False,
                (
                    f"the answer does not use the tool's result (no {check.contains!r} of "
                    f"{_quote(probe.tool_result or '')}): {_quote(text)}"
                ),
                figures,
            )
        return False, f"the answer does not contain {check.contains!r}: {_quote(text)}", figures
    if check.matches is not None and not re.search(check.matches, text):
        if probe.kind == "tool-result":
            return (
                False,
                (
                    f"the answer does not use the tool's result (no match of /{check.matches}/ from "
                    f"{_quote(probe.tool_result or '')}): {_quote(text)}"
                ),
                figures,
            )
        return False, f"the answer does not match /{check.matches}/: {_quote(text)}", figures
    if probe.json_schema is not None:
        try:
            value = json.loads(text)
        except ValueError as exc:
            return False, f"the answer is not JSON ({exc.args[0] if exc.args else exc}): {_quote(text)}", figures
        wrong = schema_violations(value, probe.json_schema)
        if wrong:
            return False, f"the JSON does not match the schema ({'; '.join(wrong)}): {_quote(text)}", figures
    what = f"{len(text)} characters" + (" streamed" if probe.stream else "")
    if probe.json_schema is not None:
        what += ", JSON matching the schema"
    if probe.kind == "tool-result":
        what += ", using the tool's result"
    return _latency(probe, seconds, what, figures)


def _judge_call(probe: ProbeSpec, calls: list[dict[str, str]], text: str, check: _Check) -> tuple[bool, str]:
    want = probe.expected_call
    if not calls:
        return False, f"the answer carries no tool call (expected {want}): content {_quote(text)}"
    call = next((c for c in calls if c.get("name") == want), None)
    if call is None:
        return False, f"the answer calls {_quote(_calls_text(calls))}, not {want}"
    raw = call.get("arguments") or ""
    try:
        args = json.loads(raw)
    except ValueError as exc:
        return False, f"the arguments of {want} are not JSON ({exc.args[0] if exc.args else exc}): {_quote(raw)}"
    tool = probe.tool(want)
    wrong = schema_violations(args, tool.parameters) if tool is not None else []
    if wrong:
        return False, f"the arguments of {want} break its parameter schema ({'; '.join(wrong)}): {_quote(raw)}"
    if check.contains is not None and check.contains not in raw:
        return False, f"the arguments of {want} do not contain {check.contains!r}: {_quote(raw)}"
    if check.matches is not None and not re.search(check.matches, raw):
        return False, f"the arguments of {want} do not match /{check.matches}/: {_quote(raw)}"
    return True, f"called {want}({raw})" + (" streamed" if probe.stream else "")


def _latency(
    probe: ProbeSpec, seconds: float, what: str, figures: dict[str, Any] | None = None
) -> tuple[bool, str, dict[str, Any]]:
    if probe.max_latency_s is not None and seconds > probe.max_latency_s:
        return False, f"answered in {seconds:.2f} s, over the limit of {probe.max_latency_s:g} s", figures or {}
    return True, f"{what} in {seconds:.2f} s", figures or {}


def _ask(
    base: str, probe: ProbeSpec, path: str, payload: dict[str, Any] | None, check: _Check, model: str
) -> tuple[bool, str, dict[str, Any], float]:
    t0 = time.monotonic()
    try:
        ans = _request(f"{base}{path}", payload, probe.timeout_s)
    except direct_http.errors() as exc:
        why = getattr(exc, "reason", exc)
        return False, f"no answer from {base} ({type(why).__name__}: {why})", {}, time.monotonic() - t0
    seconds = time.monotonic() - t0
    ok, detail, figures = _judge(probe, ans, check, seconds, model)
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
        ok, detail, figures, _ = _ask(base, probe, "/v1/models", None, _Check(None, None), model)
        return result(ok, detail, figures)
    if probe.kind == "needle":
        tokens = probe.haystack_tokens or DEFAULT_HAYSTACK_TOKENS
        depth = DEFAULT_DEPTH if probe.depth is None else probe.depth
        seed = probe.seed or 0
        hay = make_haystack(seed=seed, tokens=tokens, depth=depth)
        path, payload = _payload(probe, model, prompt=f"{hay.text}\n\n{hay.question}")
        ok, detail, figures, _ = _ask(base, probe, path, payload, _Check(hay.answer, None), model)
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
    ok, detail, figures, _ = _ask(base, probe, path, payload, _Check(probe.contains, probe.matches), model)
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
    prefix = " ".join(_filler(random.Random(seed), tokens)) if tokens else None
    if prefix:
        prefix = "Read this document; the questions after it are about other things.\n\n" + prefix
    metrics_url = recipe.drain_metrics_url()
    before = read_prefix_cache(metrics_url) if metrics_url else None
    outcomes: list[tuple[bool, str, float] | None] = [None] * n
    gate = threading.Barrier(n)

    def one(i: int) -> None:
        fill = str(i + 1)
        check = _Check(
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
            cache = f", prefix cache {int(hits)} of {int(queries)} prompt tokens hit ({100 * hits / queries:.0f}%)"
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
            from reconciler.observe.gpu import MemoryReader

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


# ---------------------------------------------------------------- vLLM's metrics: the drain's gauges, the prefix cache

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREFIX_QUERIES = "vllm:prefix_cache_queries"  # counters, in tokens (vLLM V1); *_total in the exposition
PREFIX_HITS = "vllm:prefix_cache_hits"


def parse_samples(text: str, names: Sequence[str]) -> dict[str, float] | None:
    """Each named metric's samples summed over every engine and model, from a Prometheus text exposition, by
    prometheus-client's own parser (a counter named with or without ``_total``). Only the names found are in the
    answer; None when the text is not an exposition at all."""
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
        ans = _request(url, None, timeout)
    except direct_http.errors() as exc:
        return f"!{url} did not answer ({getattr(exc, 'reason', exc)})"
    if ans.status != 200:
        return f"!{url} answered HTTP {ans.status}"
    return _body_text(ans.body)


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
