"""The front door's published state: the requests it has in flight to each lane, whether it admits new ones, and per
model name (and alias) its lane's state, the requests held for it and when it was last asked for.

Written by ``reconciler door`` (``reconciler.door``) at each of its looks (``LOOK_S``) and whenever a lane's count
falls to nothing; read by the drain before a lane leaves or sleeps (``reconciler.apply.drain``, through
``HostIO.lanes.front``), which waits for the door's requests to that lane beside the lane's own, and by ``reconciler
status`` (``door_status``). The file lives in the runtime directory beside the loop's state (``reconciler.store.lock.runtime_dir``, checked before each use, written through the one safe write) and
counts only while the pid it names is alive. It carries its format version (``reconciler.base.formats``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from reconciler.base import fsafe
from reconciler.base.formats import format_problem, stamped, unstamped
from reconciler.store.lock import lock_dir, runtime_dir

DOOR_STATE_FORMAT = 1


def door_state_path(host: str) -> Path:
    return lock_dir() / f"reconciler-{host}.door.json"


def write_door_state(host: str, data: dict[str, object]) -> None:
    """Publish the door's counts (OSError or ``fsafe.UnsafePath`` when it cannot be written safely)."""
    runtime_dir(create=True)
    # Not fsynced: written at each of the door's looks (five a second), in the runtime directory, of no use after a
    # reboot; the rename still shows each reader a whole file.
    fsafe.write_json(
        door_state_path(host), stamped({**data, "pid": os.getpid()}, DOOR_STATE_FORMAT), indent=None, durable=False
    )


def clear_door_state(host: str) -> None:
    try:
        runtime_dir(create=False)
        door_state_path(host).unlink()
    except (OSError, fsafe.UnsafePath):
        pass


def read_door_state(host: str) -> dict[str, object] | None:
    """What a running door last wrote, or None when no live door wrote it (or the file is not safe to read)."""
    try:
        runtime_dir(create=False)
        data = fsafe.read_json(door_state_path(host), what="the front door's state file")
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError, fsafe.UnsafePath):
        return None
    if not isinstance(data, dict) or format_problem(data, reads=DOOR_STATE_FORMAT):
        return None
    return unstamped(data)


def door_lane(host: str, recipe: str) -> tuple[float, int, bool] | None:
    """(when the door's last look began, on CLOCK_MONOTONIC, which every process of the host shares and no one
    steps; its requests in flight to ``recipe``'s lane; whether it admits new ones), or None without a live door. A
    door of an earlier release publishes its wall clock only: taken over to the monotonic one as of now."""
    data = read_door_state(host)
    if data is None:
        return None
    try:
        looked = data.get("looked")
        if looked is None:
            looked = float(data["at"]) - (time.time() - time.monotonic())  # type: ignore[arg-type]
        lanes = data.get("lanes") or {}
        lane = lanes.get(recipe) if isinstance(lanes, dict) else None
        if not isinstance(lane, dict):
            return float(looked), 0, True  # type: ignore[arg-type]
        return float(looked), int(lane.get("in_flight", 0)), bool(lane.get("admitting", True))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None


def door_status(host: str) -> dict[str, object] | None:
    """What ``status`` shows of a live door: its pid, when it last looked, and per model name and alias its lane's
    ``recipe`` and ``state``, the requests held for it (``queue``), how long the oldest has waited (``held_s``) and
    when it was last asked for (``last_request``); None without a live door."""
    data = read_door_state(host)
    if data is None:
        return None
    models = data.get("models")
    return {"pid": data.get("pid"), "at": data.get("at"), "models": models if isinstance(models, dict) else {}}


# A lane being taken down (drained, then stopped or put to sleep): one file per lane, named by its recipe and slots,
# which are checked at load (never a path); anything else is never written.
_LANE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*@[A-Za-z0-9][A-Za-z0-9._+-]*$")
_DOWN = ".down."


def mark_taken_down(host: str, recipe: str, slots: str) -> Callable[[], None]:
    """Publish that the lane of ``recipe`` on ``slots`` is being taken down (its drain begins: a leave or a sleep,
    whoever runs it, the loop or a stand-alone apply), for the door to hold its new requests (its view calls it
    ``leaving``); the undo, called once the lane is stopped or asleep. A lane that cannot be marked (the runtime
    directory unusable) is taken down all the same: the door's look at its health and topology is all it has then."""
    lane = f"{recipe}@{slots}"
    if not _LANE.match(lane):
        return lambda: None
    path = lock_dir() / f"reconciler-{host}{_DOWN}{lane}.json"
    try:
        runtime_dir(create=True)
        fsafe.write_json(
            path, stamped({"pid": os.getpid(), "recipe": recipe}, DOOR_STATE_FORMAT), indent=None, durable=False
        )
    except (OSError, fsafe.UnsafePath):
        return lambda: None

    def undo() -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    return undo


def read_taken_down(host: str) -> frozenset[str]:
    """The recipes of the lanes some live process is taking down now (``mark_taken_down``)."""
    prefix = f"reconciler-{host}{_DOWN}"
    out: set[str] = set()
    try:
        runtime_dir(create=False)
        names = [n for n in os.listdir(lock_dir()) if n.startswith(prefix) and n.endswith(".json")]
    except (OSError, fsafe.UnsafePath):
        return frozenset()
    for name in names:
        try:
            data = fsafe.read_json(lock_dir() / name, what="a lane's taken-down mark")
            os.kill(int(data["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError, fsafe.UnsafePath):
            continue
        if isinstance(data, dict) and not format_problem(data, reads=DOOR_STATE_FORMAT):
            out.add(str(data.get("recipe")))
    return frozenset(out)
