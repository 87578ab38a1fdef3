"""A recipe's probes (``[[probes]]``) as pydantic types: the functional checks of a lane and the functions a probe
offers the model.

Part of ``reconciler.model.recipe``'s ``Recipe``; the apply layer's probes (``reconciler.apply.probes``) run them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from reconciler.model.probe_schema import check_json_schema
from reconciler.model.rules import LOOPBACK_URL_PATTERN, check_probe_url
from reconciler.model.strict import DAY_S, _ok, _pattern, _Strict

PROBE_SUITES = ("preflight", "regression")


class ToolSpec(_Strict):
    """One function a ``tools``, ``tool-result`` or ``batch`` probe offers the model (``[[probes.tools]]``), sent as
    the OpenAI API's ``{"type": "function", "function": {name, description, parameters}}``."""

    name: str = Field(
        min_length=1, max_length=64, description="The function's name.", json_schema_extra=_pattern(r"^[A-Za-z0-9_-]+$")
    )
    description: str = Field(default="", description="What the function does, as the model reads it.")
    parameters: dict[str, object] = Field(
        default_factory=lambda: dict[str, object](type="object", properties={}),
        description="The JSON Schema of its arguments; a call's arguments are validated against it.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ok(
            None
            if re.fullmatch(r"[A-Za-z0-9_-]+", v)
            else (f"tool name {v!r} must be letters, digits, '_' and '-' (the OpenAI API's rule for function names)"),
            v,
        )

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, object]) -> dict[str, object]:
        return _ok(check_json_schema(v, "parameters"), v)

    def to_openai(self) -> dict[str, object]:
        fn: dict[str, object] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


# Which settings each kind reads; any other given is an error naming it (a setting a kind ignores would check
# nothing). Every kind reads name, kind, suite, model, base_url, status, timeout_s and max_latency_s.
_KIND_FIELDS: dict[str, frozenset[str]] = {
    "models": frozenset(),
    "chat": frozenset({"prompt", "max_tokens", "stream", "contains", "matches", "json_schema"}),
    "completion": frozenset({"prompt", "max_tokens", "stream", "contains", "matches"}),
    "tools": frozenset({"prompt", "max_tokens", "stream", "tools", "tool_choice", "function", "contains", "matches"}),
    "tool-result": frozenset(
        {"prompt", "max_tokens", "stream", "tools", "function", "arguments", "tool_result", "contains", "matches"}
    ),
    "responses": frozenset({"prompt", "max_tokens", "contains", "matches", "json_schema"}),
    "needle": frozenset({"max_tokens", "haystack_tokens", "depth", "seed"}),
    "batch": frozenset(
        {
            "prompt",
            "max_tokens",
            "tools",
            "tool_choice",
            "function",
            "contains",
            "matches",
            "requests",
            "prefix_tokens",
            "seed",
        }
    ),
}
_OPTIONAL_FIELDS = (
    "prompt",
    "stream",
    "contains",
    "matches",
    "json_schema",
    "tools",
    "tool_choice",
    "function",
    "arguments",
    "tool_result",
    "haystack_tokens",
    "depth",
    "seed",
    "requests",
    "prefix_tokens",
)


class ProbeSpec(_Strict):
    """One functional check of a lane (``[[probes]]`` in a recipe), against vLLM's OpenAI-compatible server at
    ``base_url`` (default: the origin of ``health.url``). Probes of ``suite = "preflight"`` (the default) run after
    the health URL answers and before an enter counts as done; ``regression`` ones only on demand (``reconciler
    probe RECIPE --suite regression``, the API and MCP). Kinds:

    - ``models``: GET /v1/models lists ``model``;
    - ``chat`` / ``completion``: POST /v1/chat/completions or /v1/completions with ``prompt`` (``stream``;
      ``json_schema`` asks for structured output, chat only);
    - ``tools``: a chat request offering ``tools`` with ``tool_choice``; passes when the answer calls ``function``
      with arguments that validate against its parameters (``stream``: the call reassembled from the deltas);
    - ``tool-result``: ``prompt``, the assistant's call of ``function`` with ``arguments``, and a ``tool`` message
      with ``tool_result``; passes when the answer uses the result (``contains``/``matches`` a value of it);
    - ``responses``: POST /v1/responses, the same text, regex and schema checks on its output text;
    - ``needle``: a haystack of about ``haystack_tokens`` tokens made from ``seed`` with one fact at ``depth``
      (0 the start, 1 the end); passes when the answer carries the fact;
    - ``batch``: ``requests`` at once, sharing a prefix of about ``prefix_tokens`` tokens, each with ``prompt``
      (``{i}`` is the request's number, in ``contains`` and ``matches`` too; with ``tools``, a tool call each);
      passes only when all pass.
    """

    name: str = Field(
        min_length=1,
        max_length=64,
        description="The probe's name in reasons, logs and metrics: letters, digits and '_.-'.",
        json_schema_extra=_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
    )
    kind: Literal["models", "chat", "completion", "tools", "tool-result", "responses", "needle", "batch"] = Field(
        default="chat", description="What the probe asks the server (see the settings each kind reads)."
    )
    suite: Literal["preflight", "regression"] = Field(
        default="preflight",
        description="preflight: run before an enter counts as done; regression: only on demand (reconciler probe).",
    )
    prompt: str | None = Field(default=None, description="The text sent (batch: {i} is each request's number).")
    model: str | None = Field(default=None, description="The served model's name; default: the recipe's model.id.")
    base_url: str | None = Field(
        default=None,
        description="A loopback http(s) origin of the OpenAI-compatible API; default: the origin of health.url.",
        json_schema_extra=_pattern(LOOPBACK_URL_PATTERN),
    )
    max_tokens: int = Field(default=64, ge=1, le=1 << 20, description="The most tokens the answer may have.")
    stream: bool | None = Field(
        default=None, description="Ask for a streamed answer (chat, completion, tools, tool-result)."
    )
    status: int = Field(default=200, ge=100, le=599, description="The HTTP status the answer must have.")
    contains: str | None = Field(default=None, description="Text the answer must contain.")
    matches: str | None = Field(default=None, description="A regular expression (Python's) the answer must match.")
    json_schema: dict[str, object] | None = Field(
        default=None,
        description="A JSON Schema (draft 2020-12) the answer's structured output must validate against (chat, "
        "responses).",
    )
    max_latency_s: float | None = Field(
        default=None, gt=0, le=DAY_S, description="The longest the answer may take (seconds) and still pass."
    )
    timeout_s: float = Field(default=60, gt=0, le=DAY_S, description="Seconds before the request is given up.")
    tools: list[ToolSpec] | None = Field(
        default=None, min_length=1, max_length=128, description="Functions offered to the model ([[probes.tools]])."
    )
    tool_choice: str | None = Field(
        default=None, description="auto, required, or the name of one of tools (default auto)."
    )
    function: str | None = Field(
        default=None, description="The function the answer must call (tool-result: the one that was called)."
    )
    arguments: dict[str, object] | None = Field(
        default=None, description="tool-result: the arguments of the assistant's call."
    )
    tool_result: str | None = Field(default=None, description="tool-result: what the tool answered.")
    haystack_tokens: int | None = Field(
        default=None, ge=64, le=1 << 21, description="needle: about how many tokens of haystack to send."
    )
    depth: float | None = Field(
        default=None, ge=0, le=1, description="needle: where the fact is hidden (0 the start, 1 the end)."
    )
    seed: int | None = Field(
        default=None, ge=0, le=(1 << 63) - 1, description="needle, batch: the seed the generated text is made from."
    )
    requests: int | None = Field(default=None, ge=1, le=1024, description="batch: how many requests at once.")
    prefix_tokens: int | None = Field(
        default=None, ge=0, le=1 << 21, description="batch: about how many tokens of prefix the requests share."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ok(
            None
            if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v)
            else (f"probe name {v!r} must be letters, digits and '_.-' (it names the probe in reasons and logs)"),
            v,
        )

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_probe_url(v, "probes.base_url"), v.rstrip("/"))

    @field_validator("matches")
    @classmethod
    def _matches(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"probes.matches {v!r} is not a valid regular expression ({exc})") from None
        return v

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, v: dict[str, object] | None) -> dict[str, object] | None:
        return v if v is None else _ok(check_json_schema(v, "probes.json_schema"), v)

    @model_validator(mode="after")
    def _fits_kind(self) -> ProbeSpec:
        where = f"probe {self.name!r} of kind {self.kind!r}"
        self._reads_all_it_is_given(where)
        if "prompt" in _KIND_FIELDS[self.kind] and self.kind != "batch" and not self.prompt:
            raise ValueError(f"{where} needs a prompt")
        self._tools_fit(where)
        if self.kind == "tool-result":
            self._tool_result_fits(where)
        if self.kind == "batch" and not self.prompt:
            raise ValueError(f"{where} needs a prompt ({{i}} in it is each request's number)")
        if self.stream and self.kind not in ("chat", "completion", "tools", "tool-result"):
            raise ValueError(f"{where} cannot stream; stream is for chat, completion, tools and tool-result")
        return self

    def _reads_all_it_is_given(self, where: str) -> None:
        """A setting given that the probe's kind does not read is an error naming it, and the kinds that read it."""
        reads = _KIND_FIELDS[self.kind]
        given = [k for k in _OPTIONAL_FIELDS if getattr(self, k) not in (None, False)]
        extra = [k for k in given if k not in reads]
        if self.max_tokens != 64 and "max_tokens" not in reads:
            extra.append("max_tokens")
        if not extra:
            return
        if self.kind == "models":
            why = "a models probe only lists the served models"
        else:
            takers = sorted(k for k, fields in _KIND_FIELDS.items() if set(extra) <= fields)
            why = f"kind {' or '.join(takers)} does" if 0 < len(takers) <= 3 else "remove it"
        raise ValueError(f"{where} does not read {', '.join(extra)} ({why})")

    def _tools_fit(self, where: str) -> None:
        """The tools offered, ``tool_choice`` and ``function`` agree: names unique, each one named is offered."""
        names = [t.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: two tools share a name; give each its own")
        if self.kind in ("tools", "tool-result") and not names:
            raise ValueError(f"{where} needs tools ([[probes.tools]] with name and parameters)")
        if self.tool_choice is not None and self.tool_choice not in ("auto", "required", *names):
            raise ValueError(
                f"{where}: tool_choice {self.tool_choice!r} is not auto, required or one of the tools "
                f"({', '.join(names) or 'none given'})"
            )
        if names:
            if self.function is None and len(names) > 1 and self.tool_choice not in names:
                raise ValueError(
                    f"{where}: with several tools, say which one the answer must call (function = "
                    f"one of {', '.join(names)})"
                )
            if self.function is not None and self.function not in names:
                raise ValueError(f"{where}: function {self.function!r} is not one of its tools ({', '.join(names)})")
        elif self.function is not None:
            raise ValueError(f"{where}: function {self.function!r} needs tools to call it from")

    def _tool_result_fits(self, where: str) -> None:
        """A ``tool-result`` probe carries the call and the tool's answer, and checks a value of that answer."""
        if self.tool_result is None or self.arguments is None:
            raise ValueError(
                f"{where} needs arguments (the call the assistant made) and tool_result (what the tool answered)"
            )
        if self.contains is None and self.matches is None:
            raise ValueError(f"{where} needs contains or matches: a value of tool_result the answer must use")
        if self.contains is not None and self.contains not in self.tool_result:
            raise ValueError(
                f"{where}: contains {self.contains!r} is not in tool_result, so it would not show "
                "that the answer used the result"
            )
        if self.matches is not None and not re.search(self.matches, self.tool_result):
            raise ValueError(
                f"{where}: matches /{self.matches}/ does not match tool_result, so it would not "
                "show that the answer used the result"
            )

    def tool(self, name: str | None) -> ToolSpec | None:
        return next((t for t in self.tools or () if t.name == name), None)

    @property
    def expected_call(self) -> str | None:
        """The function a ``tools`` (or tool ``batch``) answer must call."""
        if not self.tools:
            return None
        named = self.tool_choice if self.tool_choice not in (None, "auto", "required") else None
        return self.function or named or self.tools[0].name
