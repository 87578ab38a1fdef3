"""The loop's log: one line per event, text or JSON (``reconciler run --log-format``), every field redacted.

Made by ``reconciler.cli.commands.run`` for ``reconciler run`` and handed to the loop, which hands it to the front-ends it
hosts; the loop's passes, its triggers and its front-ends all write through it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

from reconciler.base.errors import one_line
from reconciler.base.redact import redact_fields
from reconciler.base.units import clip, iso_time


class Log:
    """One line per event: ``ts event key=value`` or, with json, one JSON object per line.

    Times are ISO 8601 in UTC (``Z``); in JSON a time field (``until``) stays epoch seconds. In text, a long value
    (a failed enter quotes its container's log) is cut at a word boundary with an ellipsis after ``TEXT_FIELD_MAX``
    characters, so a line stays readable in a terminal; JSON lines are never cut: they are for machines, which want
    the whole value.
    """

    TEXT_FIELD_MAX = 200

    def __init__(self, fmt: str = "text", stream: TextIO | None = None):
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        fields = redact_fields(fields)  # secrets never reach a log line (docs/design.md, safety rule 10)
        ts = iso_time(time.time(), utc=True, ms=True)
        if self.fmt == "json":
            line = json.dumps({"ts": ts, "event": event, **fields}, default=str)
        else:
            parts = " ".join(f"{k}={_text(_shown(k, v, self.TEXT_FIELD_MAX))}" for k, v in fields.items())
            line = f"{ts} {event} {parts}".rstrip()
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()


# Fields that hold a time as epoch seconds: JSON keeps the number (machines compute with it), text shows ISO 8601.
_TIME_FIELDS = frozenset({"until"})


# Fields never cut: the tool's own error messages, which end with the fix (a cut would drop it).
_WHOLE_FIELDS = frozenset({"error"})


def _shown(key: str, v: Any, limit: int) -> str:
    if key in _TIME_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool):
        return iso_time(float(v), utc=True, ms=True)
    return str(v) if key in _WHOLE_FIELDS else clip(str(v), limit)


def _text(v: Any) -> str:
    s = str(v)
    if not s.isprintable() or '"' in s or "\\" in s:
        # A control character (a newline from a request path) would start a forged line: quoted, escaped, and any
        # line separator JSON leaves alone (U+2028, U+0085) escaped too.
        return one_line(json.dumps(s, ensure_ascii=False))
    return json.dumps(s, ensure_ascii=False) if (" " in s or "=" in s or not s) else s
