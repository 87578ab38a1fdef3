"""The error hierarchy. Every error the tool raises on purpose is a ReconcilerError.

ConfigError carries the file, line and field so the CLI can print ``path:line: message``. Observation sources
that fail are not errors: they are recorded as unavailable ``Reading`` values, so callers fail closed and say which.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple


class ReconcilerError(Exception):
    """Root of all errors raised on purpose by this package. Its text is redacted (``reconciler.base.redact``) wherever
    it is shown: a message that quotes a URL, a command line or a header never carries the secret in it.

    ``code`` is the word JSON answers carry as ``error.code``: each class states its own, so that renaming or moving a
    class changes no contract (tests/contract/test_golden_errors.py lists them all)."""

    code: ClassVar[str] = "error"

    def __str__(self) -> str:
        from reconciler.base.redact import redact_text  # start-up: its patterns compile on import; few errors show

        return redact_text(super().__str__())


class ConfigProblem(NamedTuple):
    """One thing wrong with the operator's files. A NamedTuple, not a dataclass: every command imports this module,
    and the dataclasses module (with inspect and ast) is 7 ms of one that the running loop answers."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        from reconciler.base.redact import redact_text  # start-up: its patterns compile on import; few errors show

        where = f"{self.path}:{self.line}" if self.line else self.path
        return one_line(redact_text(f"{where}: {self.message}"))


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (newlines, carriage returns, NUL, escapes, Unicode line
    separators) written as its escape, so one problem is always one line of output, whatever a file held."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class ConfigError(ReconcilerError, ValueError):
    """The configuration or a manifest is invalid; holds every problem found, not only the first."""

    code = "config"

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
