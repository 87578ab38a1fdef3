"""Progress of long waits on a terminal: phase, elapsed and timeout on one redrawn line; one line per phase
when the output is not a terminal. Called by the apply layer through its Progress protocol."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from reconciler.base.units import own
from reconciler.plan.actions import Action

# The progress line's redraw (back to the line's start, clear it): the tool's own, written raw by the console.
_REDRAW = own("\r\x1b[K")


def _label(action: Action) -> str:
    if action.recipe:
        return f"{action.kind.value} {action.recipe} on {','.join(action.gpus)}"
    return f"{action.kind.value} {len(action.paths)} file(s)"


def expectation(seconds: float | None, runs: int) -> str:
    """ "expected ~3m54s (median of 3 earlier runs)", or that there is no earlier run to go by."""
    if seconds is None or not runs:
        return "no earlier run to go by"
    return f"expected ~{_dur(seconds)} (median of {runs} earlier run{'s' if runs != 1 else ''})"


def _dur(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s"


def phase_name(phase: str) -> str:
    """The phase's name without its detail: "draining: 2 running, 0 waiting" -> "draining"."""
    return phase.split(":", 1)[0].strip()


class TerminalProgress:
    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.quiet = quiet
        self._last = ""
        self._drawn = 0.0
        self._expected: float | None = None
        self._started = 0.0

    def expect(self, action: Action, seconds: float | None, runs: int) -> None:
        """Called as an enter or leave starts, with the recipe's earlier runs of the same kind."""
        self._expected = seconds
        self._started = time.monotonic()
        if self.quiet:
            return
        line = f"  {_label(action)}: {expectation(seconds, runs)}"
        if self.tty:
            self.stream.write(_REDRAW + line + "\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def phase(self, action: Action, phase: str, *, elapsed: float = 0.0, timeout: float | None = None) -> None:
        if self.quiet:
            return
        line = f"  {_label(action)}: {phase}"
        if self.tty:
            now = time.monotonic()
            if phase == self._last and now - self._drawn < 0.25:
                return
            self._drawn = now
            tail = f" {elapsed:5.1f}s / {timeout:g}s" if timeout else ""
            if self._expected is not None:
                tail += f"  [{_dur(now - self._started)} of ~{_dur(self._expected)}]"
            self.stream.write(_REDRAW + line + tail)
            self.stream.flush()
        elif phase != self._last:
            self.stream.write(line + "\n")
            self.stream.flush()
        self._last = phase

    def done(self, action: Action, result: str, seconds: float, detail: str) -> None:
        self._last = ""
        self._expected = None
        if self.quiet:
            return
        mark = {"ok": "ok", "failed": "FAILED", "interrupted": "interrupted"}.get(result, result)
        prefix = _REDRAW if self.tty else ""
        self.stream.write(f"{prefix}  {_label(action)}: {mark} in {seconds:.1f}s - {detail}\n")
        self.stream.flush()


class LogProgress:
    """The loop's progress: one log event each time an action enters a new phase (the phase's name, its detail,
    the time so far and the expected time from the recipe's earlier runs), never one per poll."""

    def __init__(self, log: Callable[..., None]):
        self.log = log
        self._last = ""
        self._expected: float | None = None
        self._started = 0.0

    def expect(self, action: Action, seconds: float | None, runs: int) -> None:
        self._expected = seconds
        self._started = time.monotonic()
        self._last = ""
        self.log(
            "action-start",
            kind=action.kind.value,
            target=action.key,
            expected_s=round(seconds, 1) if seconds is not None else None,
            earlier_runs=runs,
        )

    def phase(self, action: Action, phase: str, *, elapsed: float = 0.0, timeout: float | None = None) -> None:
        name = phase_name(phase)
        if name == self._last:
            return
        self._last = name
        self.log(
            "phase",
            kind=action.kind.value,
            target=action.key,
            phase=name,
            detail=phase,
            since_start_s=round(time.monotonic() - self._started, 1) if self._started else None,
            expected_s=round(self._expected, 1) if self._expected is not None else None,
        )

    def done(self, action: Action, result: str, seconds: float, detail: str) -> None:
        self._last = ""
        self._expected = None
        self._started = 0.0
