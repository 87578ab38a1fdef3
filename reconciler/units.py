"""Byte sizes as people read them, one format everywhere: plan reasons, status and the shm commands. Pure."""

from __future__ import annotations

GIB = 1 << 30


def human_bytes(n: int | None) -> str:
    """``1.00 GiB``, ``47.78 MiB``, ``12 B``; ``?`` when unknown."""
    if n is None:
        return "?"
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
