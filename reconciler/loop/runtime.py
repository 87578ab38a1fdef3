"""What the loop shares with the front-ends it hosts while it runs: the pass lock (``FairLock``), held for each
pass, and the gate a destructive call of a front-end holds on it (``PassGate``), so a call and a pass never
interleave. Made by ``reconciler.loop.Loop``; taken by the HTTP API (``reconciler.api``) and the command line's
commands the loop answers (``reconciler.cli.front_ends``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Self


class FairLock:
    """The loop's pass lock: first come, first served (a ticket lock), so a call of the API or MCP that waits for a
    pass runs before the next pass, however busy the loop is. Not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = 0
        self._serving = 0

    def acquire(self) -> None:
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()

    def release(self) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    def busy(self) -> bool:
        """Whether a pass (or a front-end's call) holds the lock or waits for it: the status page looks again."""
        with self._cond:
            return self._next != self._serving

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PassGate:
    """What a destructive call of the API or MCP holds: the loop's pass lock, logged when taken and given back, so
    the loop's log shows that no pass ran meanwhile."""

    def __init__(self, lock: Any, log: Callable[..., None] | None, front: str):
        self.lock = lock
        self.log = log
        self.front = front
        self._t0 = 0.0

    def __enter__(self) -> Self:
        t = time.monotonic()
        self.lock.acquire()
        self._t0 = time.monotonic()
        if self.log:
            self.log("api-exclusive", front=self.front, waited_s=round(self._t0 - t, 3))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.log:
            self.log("api-exclusive-end", front=self.front, seconds=round(time.monotonic() - self._t0, 3))
        self.lock.release()
