"""Progress of long waits on a terminal: phase, elapsed and timeout on one redrawn line; one line per phase
when the output is not a terminal. Called by the apply layer through its Progress protocol."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from reconciler.planner import Action


def _label(action: Action) -> str:
    if action.recipe:
        return f"{action.kind.value} {action.recipe} on {','.join(action.gpus)}"
    return f"{action.kind.value} {len(action.paths)} file(s)"


class TerminalProgress:
    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.quiet = quiet
        self._last = ""
        self._drawn = 0.0

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
            self.stream.write("\r\x1b[K" + line + tail)
            self.stream.flush()
        elif phase != self._last:
            self.stream.write(line + "\n")
            self.stream.flush()
        self._last = phase

    def done(self, action: Action, result: str, seconds: float, detail: str) -> None:
        self._last = ""
        if self.quiet:
            return
        mark = {"ok": "ok", "failed": "FAILED", "interrupted": "interrupted"}.get(result, result)
        prefix = "\r\x1b[K" if self.tty else ""
        self.stream.write(f"{prefix}  {_label(action)}: {mark} in {seconds:.1f}s - {detail}\n")
        self.stream.flush()
