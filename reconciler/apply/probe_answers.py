"""Judging one probe's answer: its status, its text (a completion, a chat message, a Responses output, or an
OpenAI server-sent event stream reassembled from its deltas), its tool calls, and both against the probe's
``contains``/``matches``, its JSON Schemas and its latency limit.

Called by ``reconciler.apply.probes`` for each request it sends. Answers are judged against JSON Schemas by
``jsonschema`` (imported on the first schema check).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.apply.lane_http import Answer, body_text, quote
from reconciler.model import ProbeSpec

# ---------------------------------------------------------------- JSON Schema, through jsonschema


def schema_violations(value: Any, schema: dict[str, Any], *, limit: int = 3) -> list[str]:
    """Where ``value`` breaks ``schema`` (draft 2020-12), each as ``$.path: message``; empty when it matches."""
    # jsonschema costs about 0.3 s to import: only a probe that carries a schema pays for it (as the model's
    # check_json_schema does).
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
    for raw in body_text(body).splitlines():
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
            s.problem = f"an event that is not JSON: {quote(data)}"
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


def calls_text(calls: Sequence[dict[str, str]]) -> str:
    return ", ".join(f"{c.get('name') or '?'}({c.get('arguments') or ''})" for c in calls) or "no tool call"


# ---------------------------------------------------------------- one answer, judged


@dataclass(frozen=True)
class Check:
    """What one request's answer must show (a batch's request has its own, with ``{i}`` filled in)."""

    contains: str | None
    matches: str | None


class _Unfit(Exception):
    """An answer that fails its probe before its text is judged: the detail says what came back."""

    def __init__(self, detail: str, figures: dict[str, Any] | None = None):
        super().__init__(detail)
        self.detail = detail
        self.figures = figures or {}


def judge(probe: ProbeSpec, ans: Answer, check: Check, seconds: float, model: str) -> tuple[bool, str, dict[str, Any]]:
    """(passed, detail, figures) of one answer."""
    body = body_text(ans.body)
    if ans.status != probe.status:
        return False, f"HTTP {ans.status}, expected {probe.status}: {quote(body)}", {}
    if probe.status >= 300:
        return True, f"HTTP {ans.status} as expected in {seconds:.2f} s", {}
    try:
        if probe.kind == "models":
            return latency(probe, seconds, _models_listed(ans, body, model))
        if probe.stream:
            text, calls = _streamed(probe, ans, body)
            figures: dict[str, Any] = {}
        elif probe.kind == "responses":
            text, calls, figures = _response_text(ans, body), [], {}
        else:
            text, calls, figures = _choice(probe, ans, body)
    except _Unfit as unfit:
        return False, unfit.detail, unfit.figures
    if probe.tools and probe.kind in ("tools", "batch"):
        ok, detail = judge_call(probe, calls, text, check)
        if not ok:
            return False, detail, figures
        return latency(probe, seconds, detail, figures)
    wrong = _text_problem(probe, text, check)
    if wrong:
        return False, wrong, figures
    what = f"{len(text)} characters" + (" streamed" if probe.stream else "")
    if probe.json_schema is not None:
        what += ", JSON matching the schema"
    if probe.kind == "tool-result":
        what += ", using the tool's result"
    return latency(probe, seconds, what, figures)


def _models_listed(ans: Answer, body: str, model: str) -> str:
    """What /v1/models says of ``model``: that it lists it (or ``_Unfit``)."""
    try:
        ids = [m.get("id") for m in json.loads(ans.body).get("data") or ()]
    except (ValueError, AttributeError):
        raise _Unfit(f"/v1/models answered something that is not a model list: {quote(body)}") from None
    if model not in ids:
        raise _Unfit(f"/v1/models lists {ids or 'no model'}, not {model!r}")
    return f"/v1/models lists {model!r}"


def _streamed(probe: ProbeSpec, ans: Answer, body: str) -> tuple[str, list[dict[str, str]]]:
    """The text and tool calls of a streamed answer, which must close with a finish_reason and 'data: [DONE]'."""
    if "text/event-stream" not in ans.ctype:
        raise _Unfit(f"asked to stream, got {ans.ctype or 'no content type'}, not text/event-stream: {quote(body)}")
    s = _read_sse(ans.body, chat=probe.kind != "completion")
    if s.problem:
        raise _Unfit(s.problem)
    calls = [s.calls[i] for i in sorted(s.calls)]
    if not s.done or not s.finished:
        missing = " and ".join(
            w for w, gone in (("no finish_reason", not s.finished), ("no 'data: [DONE]'", not s.done)) if gone
        )
        if calls:
            raise _Unfit(
                f"the stream ended without closing its tool call ({missing}); reassembled so far: "
                f"{quote(calls_text(calls))}"
            )
        raise _Unfit(f"the stream ended without 'data: [DONE]' ({missing}; text so far {quote(s.text)})")
    return s.text, calls


def _response_text(ans: Answer, body: str) -> str:
    """The output text of a Responses answer (``/v1/responses``)."""
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
        raise _Unfit(f"/v1/responses answered something that is not a Response: {quote(body)}") from None
    texts = [t for t in parts if isinstance(t, str)]
    if not texts or not "".join(texts).strip():
        kinds = [item.get("type") for item in output if isinstance(item, dict)]
        raise _Unfit(
            f"the Responses answer has no output text (status {doc.get('status')!r}, output items "
            f"{kinds or 'none'}): {quote(body)}"
        )
    return "".join(texts)


def _choice(probe: ProbeSpec, ans: Answer, body: str) -> tuple[str, list[dict[str, str]], dict[str, Any]]:
    """The text, tool calls and prompt token count of a completion or chat answer's first choice."""
    figures: dict[str, Any] = {}
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
        raise _Unfit(f"no completion in the answer: {quote(body)}") from None
    if text is None and calls:
        text = ""
    if not isinstance(text, str):
        raise _Unfit(f"no completion text in the answer: {quote(body)}", figures)
    return text, calls, figures


def _text_problem(probe: ProbeSpec, text: str, check: Check) -> str | None:
    """Why an answer's text fails ``check`` and the probe's JSON Schema; None when it passes."""
    if check.contains is not None and check.contains not in text:
        if probe.kind == "tool-result":
            return (
                f"the answer does not use the tool's result (no {check.contains!r} of "
                f"{quote(probe.tool_result or '')}): {quote(text)}"
            )
        return f"the answer does not contain {check.contains!r}: {quote(text)}"
    if check.matches is not None and not re.search(check.matches, text):
        if probe.kind == "tool-result":
            return (
                f"the answer does not use the tool's result (no match of /{check.matches}/ from "
                f"{quote(probe.tool_result or '')}): {quote(text)}"
            )
        return f"the answer does not match /{check.matches}/: {quote(text)}"
    if probe.json_schema is not None:
        try:
            value = json.loads(text)
        except ValueError as exc:
            return f"the answer is not JSON ({exc.args[0] if exc.args else exc}): {quote(text)}"
        wrong = schema_violations(value, probe.json_schema)
        if wrong:
            return f"the JSON does not match the schema ({'; '.join(wrong)}): {quote(text)}"
    return None


def judge_call(probe: ProbeSpec, calls: list[dict[str, str]], text: str, check: Check) -> tuple[bool, str]:
    want = probe.expected_call
    if not calls:
        return False, f"the answer carries no tool call (expected {want}): content {quote(text)}"
    call = next((c for c in calls if c.get("name") == want), None)
    if call is None:
        return False, f"the answer calls {quote(calls_text(calls))}, not {want}"
    raw = call.get("arguments") or ""
    try:
        args = json.loads(raw)
    except ValueError as exc:
        return False, f"the arguments of {want} are not JSON ({exc.args[0] if exc.args else exc}): {quote(raw)}"
    tool = probe.tool(want)
    wrong = schema_violations(args, tool.parameters) if tool is not None else []
    if wrong:
        return False, f"the arguments of {want} break its parameter schema ({'; '.join(wrong)}): {quote(raw)}"
    if check.contains is not None and check.contains not in raw:
        return False, f"the arguments of {want} do not contain {check.contains!r}: {quote(raw)}"
    if check.matches is not None and not re.search(check.matches, raw):
        return False, f"the arguments of {want} do not match /{check.matches}/: {quote(raw)}"
    return True, f"called {want}({raw})" + (" streamed" if probe.stream else "")


def latency(
    probe: ProbeSpec, seconds: float, what: str, figures: dict[str, Any] | None = None
) -> tuple[bool, str, dict[str, Any]]:
    if probe.max_latency_s is not None and seconds > probe.max_latency_s:
        return False, f"answered in {seconds:.2f} s, over the limit of {probe.max_latency_s:g} s", figures or {}
    return True, f"{what} in {seconds:.2f} s", figures or {}
