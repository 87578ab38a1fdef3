"""A running loop's published state: its backoff, its last pass, the desired state it acts on.

Written by the loop (``reconciler.loop``) after each pass and cleared when it stops; read by ``reconciler status``,
``plan`` and ``apply`` through the service layer (``reconciler.service``), which then plan with the loop's view. The
file lives in the runtime directory beside the host lock (``reconciler.store.lock.runtime_dir``, checked before each
use), and counts only while the pid it names is alive. It carries its format version (``reconciler.base.formats``):
one of a newer format, written by a loop of a newer release, is not read (the command line then runs stand-alone, as
for any loop of another version).
"""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.base import fsafe
from reconciler.base.formats import format_problem, stamped, unstamped
from reconciler.store.lock import lock_dir, runtime_dir

LOOP_STATE_FORMAT = 1


def state_path(host: str) -> Path:
    """Where a running loop publishes its backoff and last pass, for ``reconciler status``."""
    return lock_dir() / f"reconciler-{host}.state.json"


def write_loop_state(host: str, data: dict[str, object]) -> None:
    """Publish the loop's state (OSError or ``fsafe.UnsafePath`` when it cannot be written safely)."""
    runtime_dir(create=True)
    fsafe.write_json(state_path(host), stamped(data, LOOP_STATE_FORMAT), indent=None)


def clear_loop_state(host: str) -> None:
    try:
        runtime_dir(create=False)
        state_path(host).unlink()
    except (OSError, fsafe.UnsafePath):
        pass


def read_loop_state(host: str) -> dict[str, object] | None:
    """What a running loop last wrote, or None when no live loop wrote it. ``fsafe.UnsafePath`` when the runtime
    directory or the file could have been written by another user."""
    try:
        runtime_dir(create=False)
        data = fsafe.read_json(state_path(host), what="the loop's state file")
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(data, dict) or format_problem(data, reads=LOOP_STATE_FORMAT):
        return None
    return unstamped(data)
