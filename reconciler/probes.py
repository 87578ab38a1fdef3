"""Functional preflight: a recipe's ``[[probes]]`` run against its running lane, and vLLM's request gauges.

Called by the apply layer (after the health URL answers, before an enter counts as done; before a leave, for the
drain) and by ``reconciler probe RECIPE`` through the service layer. Plain HTTP against the lane's own port on this
host, never through a proxy named in the environment (a proxy would answer, or fail, for a server it is not).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from reconciler import direct_http
from reconciler.model import ProbeSpec, Recipe
from reconciler.schema_check import violations

_SHOWN = 200  # characters of an answer quoted in a reason


@dataclass(frozen=True)
class ProbeResult:
    name: str
    kind: str
    ok: bool
    seconds: float
    detail: str  # what was checked (ok) or what came back (failed)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "ok": self.ok, "seconds": round(self.seconds, 3),
                "detail": self.detail}

    def reason(self) -> str:
        return f"probe {self.name!r} ({self.kind}) failed: {self.detail}"


def _quote(text: str) -> str:
    text = text.strip().replace("\n", " ")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


class _Answer:
    def __init__(self, status: int, body: bytes, ctype: str):
        self.status = status
        self.body = body
        self.ctype = ctype


def _request(url: str, payload: dict[str, Any] | None, timeout: float) -> _Answer:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with direct_http.opener().open(req, timeout=timeout) as resp:  # noqa: S310 - the recipe's own loopback URL
            return _Answer(resp.status, resp.read(), resp.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as exc:
        return _Answer(exc.code, exc.read(), exc.headers.get("Content-Type", "") if exc.headers else "")


def _sse_text(body: bytes, *, chat: bool) -> tuple[str | None, str]:
    """The text of an OpenAI server-sent event stream, or None and why it is not a complete one."""
    parts: list[str] = []
    done = finished = False
    for raw in body.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            return None, f"an event that is not JSON: {_quote(data)}"
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece:
                parts.append(piece)
            if choice.get("finish_reason"):
                finished = True
    if not done:
        got = "".join(parts)
        return None, f"the stream ended without 'data: [DONE]' ({'no finish_reason, ' if not finished else ''}text so far {_quote(got)})"
    return "".join(parts), ""


def run_probe(probe: ProbeSpec, recipe: Recipe) -> ProbeResult:
    """One probe against the recipe's running lane; never raises for what the server does."""
    base = probe.base_url or recipe.api_origin() or ""
    model = probe.model or recipe.model.id
    t0 = time.monotonic()

    def result(ok: bool, detail: str) -> ProbeResult:
        return ProbeResult(probe.name, probe.kind, ok, time.monotonic() - t0, detail)

    try:
        if probe.kind == "models":
            ans = _request(f"{base}/v1/models", None, probe.timeout_s)
        else:
            chat = probe.kind == "chat"
            payload: dict[str, Any] = {"model": model, "max_tokens": probe.max_tokens, "temperature": 0}
            if chat:
                payload["messages"] = [{"role": "user", "content": probe.prompt}]
            else:
                payload["prompt"] = probe.prompt
            if probe.stream:
                payload["stream"] = True
            if probe.json_schema is not None:
                payload["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": probe.name.replace(".", "_").replace("-", "_"), "schema": probe.json_schema},
                }
            path = "/v1/chat/completions" if chat else "/v1/completions"
            ans = _request(f"{base}{path}", payload, probe.timeout_s)
    except direct_http.errors() as exc:
        why = getattr(exc, "reason", exc)
        return result(False, f"no answer from {base} ({type(why).__name__}: {why})")
    seconds = time.monotonic() - t0
    if ans.status != probe.status:
        return result(False, f"HTTP {ans.status}, expected {probe.status}: {_quote(ans.body.decode('utf-8', 'replace'))}")
    if probe.kind == "models":
        try:
            ids = [m.get("id") for m in json.loads(ans.body).get("data") or ()]
        except (ValueError, AttributeError):
            return result(False, f"/v1/models answered something that is not a model list: {_quote(ans.body.decode('utf-8', 'replace'))}")
        if model not in ids:
            return result(False, f"/v1/models lists {ids or 'no model'}, not {model!r}")
        text = model
    elif probe.stream:
        if "text/event-stream" not in ans.ctype:
            return result(False, f"asked to stream, got {ans.ctype or 'no content type'}, not text/event-stream: "
                                 f"{_quote(ans.body.decode('utf-8', 'replace'))}")
        streamed, why = _sse_text(ans.body, chat=probe.kind == "chat")
        if streamed is None:
            return result(False, why)
        text = streamed
    else:
        try:
            choice = (json.loads(ans.body).get("choices") or [{}])[0]
            text = (choice.get("message") or {}).get("content") if probe.kind == "chat" else choice.get("text")
        except (ValueError, AttributeError, IndexError):
            text = None
        if not isinstance(text, str):
            return result(False, f"no completion text in the answer: {_quote(ans.body.decode('utf-8', 'replace'))}")
    if probe.contains is not None and probe.contains not in text:
        return result(False, f"the answer does not contain {probe.contains!r}: {_quote(text)}")
    if probe.matches is not None and not re.search(probe.matches, text):
        return result(False, f"the answer does not match /{probe.matches}/: {_quote(text)}")
    if probe.json_schema is not None:
        try:
            value = json.loads(text)
        except ValueError as exc:
            return result(False, f"the answer is not JSON ({exc.args[0] if exc.args else exc}): {_quote(text)}")
        wrong = violations(value, probe.json_schema)
        if wrong:
            return result(False, f"the JSON does not match the schema ({'; '.join(wrong[:3])}): {_quote(text)}")
    if probe.max_latency_s is not None and seconds > probe.max_latency_s:
        return result(False, f"answered in {seconds:.2f} s, over the limit of {probe.max_latency_s:g} s")
    what = {"models": f"/v1/models lists {model!r}"}.get(probe.kind, f"{len(text)} characters"
                                                          + (" streamed" if probe.stream else "")
                                                          + (", JSON matching the schema" if probe.json_schema else ""))
    return result(True, f"{what} in {seconds:.2f} s")


# ---------------------------------------------------------------- vLLM's request gauges, for the drain

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_gauges(text: str) -> tuple[float, float] | None:
    """(running, waiting) summed over every engine and model in a Prometheus text exposition; None when neither
    gauge is there (not a vLLM /metrics)."""
    sums = {RUNNING: 0.0, WAITING: 0.0}
    seen = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m and m.group(1) in sums:
            try:
                sums[m.group(1)] += float(m.group(3))
                seen = True
            except ValueError:
                continue
    return (sums[RUNNING], sums[WAITING]) if seen else None


def read_gauges(url: str, *, timeout: float = 2.0) -> tuple[float, float] | str:
    """(running, waiting) from a lane's /metrics, or why they could not be read."""
    try:
        ans = _request(url, None, timeout)
    except direct_http.errors() as exc:
        return f"{url} did not answer ({getattr(exc, 'reason', exc)})"
    if ans.status != 200:
        return f"{url} answered HTTP {ans.status}"
    gauges = parse_gauges(ans.body.decode("utf-8", "replace"))
    if gauges is None:
        return f"{url} has no {RUNNING} / {WAITING}"
    return gauges
