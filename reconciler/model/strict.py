"""What every file model shares: the strict pydantic base, the validator's answer and the schema-only pattern.

Imported by the file models (``reconciler.model.host``, ``.recipe``, ``.probe_spec``, ``.manifest``) only.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

_T = TypeVar("_T")

# The longest wait any setting may ask for (seconds).
DAY_S = 86400.0


def _pattern(pattern: str) -> dict[str, Any]:
    """A field's schema-only pattern (the validator keeps its own check and message)."""
    return {"pattern": pattern}


def _ok(problem: str | None, value: _T) -> _T:
    """A validator's answer: the value, or the rule's problem as the ValueError pydantic reports."""
    if problem:
        raise ValueError(problem)
    return value


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default. No inf or nan anywhere. Types are
    strict: YAML and TOML give real integers, booleans and numbers, so a quoted ``"1"`` where a number belongs is
    a mistake to name, not a string to convert (an integer is still a number where a float is asked for)."""

    # defer_build: a model's validator is built when it first validates, not when this module is imported; the
    # nested models are then built once, inside the file models' schemas (about 15 ms of every command's start).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True, strict=True)
