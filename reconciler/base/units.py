"""Byte sizes, times and long text as people read them, one format everywhere: plan reasons, status, the shm
commands, the audit trail and the loop's text log. Pure."""

from __future__ import annotations

import os
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


def percent(part: float, whole: float) -> str:
    """``part`` of ``whole`` in per cent to a tenth, as people read it: ``99.7%``, ``100%``, ``0%``; a share that is
    not all (or not none) never reads as ``100%`` (or ``0%``) by rounding: ``99.9%``, ``0.1%`` at the most and
    least."""
    if whole <= 0:
        return "?"
    if part >= whole:
        return "100%"
    if part <= 0:
        return "0%"
    value = min(max(100 * part / whole, 0.1), 99.9)
    text = f"{value:.1f}".removesuffix(".0")
    return f"{text}%"


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


# ---------------------------------------------------------------- text for a terminal

# The tool's own control sequences (colour, the progress line's redraw) carry OWN before each of their control
# characters (``own``); the terminal boundary (``terminal_text``, through the console of reconciler.cli.common)
# writes those raw and every other control character escaped. OWN is drawn at random per process from Unicode's
# private use plane 15: text from outside (a file name, a container's log line) cannot carry it.
OWN = "".join(chr(0xF0000 + b) for b in os.urandom(8))
# C0 but newline and tab, DEL, C1 (U+0080..U+009F, among them U+009B, an ESC-[ of its own on some terminals).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x80 else f"\\u{c:04x}"


def own(seq: str) -> str:
    """A control sequence of the tool itself (``"\\x1b[1m"``, ``"\\r\\x1b[K"``), marked so that the terminal
    boundary writes it as it is."""
    return _CONTROL.sub(lambda m: OWN + m.group(), seq)


def terminal_text(text: str) -> str:
    """``text`` as it may reach a terminal: every control character that is not the tool's own (``own``) shown as
    its escape (``\\x1b``, ``\\u009b``), so a file name or a log line can never move the cursor, retitle the window
    or hide what follows; newline and tab stay."""
    if OWN not in text:
        return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text
    parts = text.split(OWN)
    out = [_CONTROL.sub(_escape, parts[0])]
    for part in parts[1:]:
        if part and _CONTROL.match(part):
            out.append(part[0] + _CONTROL.sub(_escape, part[1:]))
        else:
            out.append(_CONTROL.sub(_escape, part))
    return "".join(out)
