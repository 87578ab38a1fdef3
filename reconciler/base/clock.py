"""The clocks and the wait the apply layer, the shm guard and the loop read through: ``Clock`` (``REAL_CLOCK``: the
``time`` module's).

One part of the host's I/O seams (``reconciler.apply.host_io.HostIO.clock``): the simulation hands in its world's
clocks (a wall clock that may jump apart from the monotonic one) and a sleep that moves them.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """``time`` (the wall clock, Unix seconds), ``monotonic`` (durations and deadlines) and ``sleep``."""

    time: Callable[[], float] = _time.time
    monotonic: Callable[[], float] = _time.monotonic
    sleep: Callable[[float], None] = _time.sleep


REAL_CLOCK = Clock()
