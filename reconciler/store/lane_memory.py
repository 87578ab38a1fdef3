"""The GPU memory each sleeping-mode lane held, per container and slot: measured by the apply layer after an enter or
a wake (awake) and after a sleep (asleep), under the host's state directory (``lane-memory.json``).

A wake's memory check reads it: waking takes the lane's awake footprint less what it still holds asleep, and the
card must have that free beyond its reserve (docs/design.md, sleeping lanes rules 1 and 2). Advice kept as a small
JSON file: a damaged one is treated as empty (the wake is then checked by NVML's figures after it, as an enter is).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from reconciler.plan.observed import LaneMemory
from reconciler.store.state import StateError, read_record, write_record

NAME = "lane-memory.json"


def read_lane_memory(host: str) -> dict[str, LaneMemory]:
    try:
        data = read_record(host, NAME)
    except StateError:
        return {}
    out: dict[str, LaneMemory] = {}
    for cid, rec in data.items():
        if not isinstance(rec, dict):
            continue
        out[cid] = LaneMemory(awake=_slots(rec.get("awake")), asleep=_slots(rec.get("asleep")))
    return out


def record_lane_memory(
    host: str, container_id: str, how: str, by_slot: Mapping[str, int], *, existing: Collection[str] | None = None
) -> None:
    """The bytes per slot a lane's container held ``how`` ("awake" or "asleep"); containers not in ``existing``
    (when given) are forgotten."""
    try:
        data = read_record(host, NAME)
        if existing is not None:
            data = {k: v for k, v in data.items() if k in existing}
        rec = data.get(container_id)
        rec = rec if isinstance(rec, dict) else {}
        rec[how] = {str(k): int(v) for k, v in by_slot.items()}
        data[container_id] = rec
        write_record(host, NAME, data)
    except StateError:
        return


def _slots(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
