"""What a host remembers of its past lanes, under the host's state directory (``state.read_record`` and
``state.write_record``): the last converged topology (for the
fallback while a wanted lane waits in backoff) and how long each recipe's earlier enters and leaves took (for the
progress's expected time).

Written by the apply layer under the host lock (a pass that converged; an enter or leave that succeeded); read
by the loop, ``plan`` and ``status``. Small JSON files, written atomically; a damaged one is treated as empty
(history is advice, never a reason to fail an action).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from typing import Any

from reconciler.store.state import StateError, read_record, write_record

KEEP_RUNS = 10  # durations kept per recipe and kind; the expectation is their median


def _read(name: str, host: str) -> dict[str, Any]:
    try:
        return read_record(host, name)
    except StateError:
        return {}


def record_topology(host: str, assignments: Iterable[tuple[str, tuple[str, ...]]]) -> None:
    """The assignments (recipe, slots) of a pass that converged: what the host last served as wanted."""
    data = {"at": time.time(), "assignments": [{"recipe": r, "gpus": list(s)} for r, s in assignments]}
    try:
        if _read("topology.json", host).get("assignments") == data["assignments"]:
            return  # unchanged: no write on every converged pass
        write_record(host, "topology.json", data)
    except StateError:
        return


def last_topology(host: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The last converged topology, as (recipe, slots) pairs; empty when none was recorded."""
    out = []
    for a in _read("topology.json", host).get("assignments") or ():
        if isinstance(a, dict) and isinstance(a.get("recipe"), str) and isinstance(a.get("gpus"), list):
            out.append((a["recipe"], tuple(str(g) for g in a["gpus"])))
    return tuple(out)


def record_duration(host: str, recipe: str, kind: str, seconds: float) -> None:
    """One successful enter or leave of ``recipe`` took ``seconds``."""
    try:
        data = _read("durations.json", host)
        runs = data.setdefault(recipe, {})
        if not isinstance(runs, dict):
            runs = data[recipe] = {}
        past = [float(x) for x in runs.get(kind) or () if isinstance(x, (int, float))]
        runs[kind] = [*past, round(seconds, 3)][-KEEP_RUNS:]
        write_record(host, "durations.json", data)
    except StateError:
        return


def expected(host: str, recipe: str, kind: str) -> tuple[float, int] | None:
    """(median seconds, runs) of the recipe's earlier successful ``kind`` ("enter", "leave"); None without any."""
    runs = _read("durations.json", host).get(recipe)
    past = [float(x) for x in (runs.get(kind) if isinstance(runs, dict) else None) or () if isinstance(x, (int, float))]
    if not past:
        return None
    return statistics.median(past), len(past)
