"""The error hierarchy. Every error the tool raises on purpose is a ReconcilerError.

ConfigError carries the file, line and field so the CLI can print ``path:line: message``; SourceUnavailable
names the observation source (docker, proc, gpu) that failed, so callers fail closed and say which one.
"""

from __future__ import annotations

from dataclasses import dataclass


class ReconcilerError(Exception):
    """Root of all errors raised on purpose by this package."""


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with the operator's files."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


class ConfigError(ReconcilerError, ValueError):
    """The configuration or a manifest is invalid; holds every problem found, not only the first."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class SourceUnavailable(ReconcilerError, RuntimeError):
    """An observation source (docker, proc, gpu) could not be read completely: act on nothing that needs it."""

    def __init__(self, source: str, detail: str):
        self.source = source
        self.detail = detail
        super().__init__(f"{source} unavailable: {detail}")
