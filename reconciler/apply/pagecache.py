"""Dropping clean page cache after a leave (``page_cache: {drop_after_leave: true}`` in configs/host.yaml).

On WSL2 the Linux VM's page cache holds host memory Windows cannot take back: the field report's managed leave
"reduced WSL page cache from 9.6 to 0.9 GB". After a leave the apply layer calls ``drop_page_cache``: ``sync``,
then ``1`` to ``/proc/sys/vm/drop_caches`` (clean page cache only; dirty pages were written by the sync, and
dentries and inodes stay), with ``Cached`` of ``/proc/meminfo`` read before and after. A kernel that refuses
(no root, a read-only /proc/sys in a container) is reported as refused, with its error; nothing else fails.

Never while an enter waits for health: a model load reads its weights through that cache, and dropping it mid-load
makes the load read them from disk again. ``entering()`` marks an enter in progress (the apply layer holds it from
create to settled); ``drop_page_cache`` refuses while any is marked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from reconciler.base.units import human_bytes

MEMINFO = "/proc/meminfo"
DROP_CACHES = "/proc/sys/vm/drop_caches"

_lock = threading.Lock()
_entering = 0


@contextmanager
def entering() -> Iterator[None]:
    """Mark an enter that waits for its engine to load and become healthy (nestable, thread-safe)."""
    global _entering
    with _lock:
        _entering += 1
    try:
        yield
    finally:
        with _lock:
            _entering -= 1


def enter_in_progress() -> bool:
    with _lock:
        return _entering > 0


def parse_cached_bytes(meminfo: str) -> int | None:
    """``Cached:`` of /proc/meminfo in bytes (the kernel writes kB, meaning KiB); None when absent. Pure."""
    for line in meminfo.splitlines():
        if line.startswith("Cached:"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def read_cached_bytes(path: str = MEMINFO) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return parse_cached_bytes(fh.read())
    except OSError:
        return None


@dataclass(frozen=True)
class PageCacheDrop:
    """What one drop did: ``result`` is ``dropped``, ``refused`` (the kernel said no: ``error`` says how) or
    ``skipped`` (an enter was waiting for health)."""

    result: str
    before_bytes: int | None
    after_bytes: int | None
    error: str = ""

    def to_json(self) -> dict:
        return {
            "result": self.result,
            "before_bytes": self.before_bytes,
            "after_bytes": self.after_bytes,
            "error": self.error,
        }

    def describe(self) -> str:
        if self.result == "dropped":
            return f"page cache {human_bytes(self.before_bytes)} -> {human_bytes(self.after_bytes)}"
        if self.result == "skipped":
            return f"page cache not dropped: {self.error}"
        return f"page cache not dropped, the kernel refused: {self.error} (Cached {human_bytes(self.before_bytes)})"


def drop_page_cache(*, drop_caches: str = DROP_CACHES, meminfo: str = MEMINFO) -> PageCacheDrop:
    """``sync``, then write ``1`` to ``drop_caches``; ``Cached`` before and after. Never raises."""
    before = read_cached_bytes(meminfo)
    if enter_in_progress():
        return PageCacheDrop(
            "skipped", before, before, "an enter is waiting for health (its model load reads through the page cache)"
        )
    os.sync()
    try:
        with open(drop_caches, "w", encoding="ascii") as fh:
            fh.write("1\n")
    except OSError as exc:
        return PageCacheDrop("refused", before, read_cached_bytes(meminfo), f"writing {drop_caches}: {exc}")
    return PageCacheDrop("dropped", before, read_cached_bytes(meminfo))
