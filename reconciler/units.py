"""Byte sizes, times and long text as people read them, one format everywhere: plan reasons, status, the shm
commands, the audit trail and the loop's text log. Pure."""

from __future__ import annotations

import re
import time

GIB = 1 << 30


def human_bytes(n: int | None) -> str:
    """``1.00 GiB``, ``47.78 MiB``, ``12 B``; ``?`` when unknown."""
    if n is None:
        return "?"
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def iso_time(ts: float, *, utc: bool = False, ms: bool = False) -> str:
    """ISO 8601 with its zone: ``2026-11-30T18:04:05+01:00`` in local time, ``2026-11-30T17:04:05Z`` with ``utc``;
    ``ms`` adds milliseconds. A time without its zone is ambiguous across hosts and daylight saving."""
    t = time.gmtime(ts) if utc else time.localtime(ts)
    frac = f".{int(ts * 1000) % 1000:03d}" if ms else ""
    if utc:
        return time.strftime("%Y-%m-%dT%H:%M:%S", t) + frac + "Z"
    off = time.strftime("%z", t)  # +0100
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + frac + f"{off[:3]}:{off[3:]}"


# Where a long text may be cut: after a space or a separator, never inside a word (a name, a number, a path part).
_BREAK = re.compile(r"[\s,;:)\]}/|]")


def clip(text: str, limit: int) -> str:
    """``text`` shortened to at most about ``limit`` characters at a word boundary, with an ellipsis; unchanged
    when it fits, or when it is one unbroken word (better long than wrong)."""
    if len(text) <= limit:
        return text
    cut = max((m.end() for m in _BREAK.finditer(text, 0, limit)), default=0)
    if cut == 0:
        m = _BREAK.search(text, limit)
        if m is None:
            return text
        cut = m.end()
        if cut >= len(text):
            return text
    return text[:cut].rstrip() + " …"
