"""The door's held requests: per model, in arrival order, bounded by ``door.max_queue`` with a share per client, each
waiting at most ``door.hold_s`` for its lane to serve (docs/design.md, the front door).

Pure asyncio: no I/O. ``reconciler.door.app`` holds a request here while its lane is entering, waking, asleep or about
to leave; the door's look at the host (``reconciler.door.run``) releases each model's queue, oldest first, once its
lane serves, or refuses it at once (a blocked topology). Called on the door's event loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field


class Refused(Exception):
    """A held request will not be sent: the status, the seconds to retry after and why, in words."""

    def __init__(self, status: int, why: str, *, retry_after: float, kind: str):
        super().__init__(why)
        self.status = status
        self.why = why
        self.retry_after = retry_after
        self.kind = kind


@dataclass
class _Waiter:
    client: str
    future: asyncio.Future[None]
    since: float = field(default_factory=time.monotonic)


class Holds:
    """Every model's queue of held requests."""

    def __init__(self, *, max_queue: int, hold_s: float):
        self.max_queue = max_queue
        self.hold_s = hold_s
        self.queues: dict[str, deque[_Waiter]] = {}

    def share(self) -> int:
        """How many held requests of one model one client may have: a quarter of the queue, at least one."""
        return max(1, self.max_queue // 4)

    def depth(self, model: str) -> int:
        return len(self.queues.get(model, ()))

    def oldest_s(self, model: str | None = None) -> float:
        """How long the oldest request held (for ``model``, else for any) has waited so far."""
        now = time.monotonic()
        queues = [self.queues.get(model, ())] if model is not None else self.queues.values()
        return max((now - w.since for q in queues for w in q), default=0.0)

    async def wait(self, model: str, client: str, *, why: str) -> float:
        """Hold until ``release(model)``: the seconds held; ``Refused`` when the queue is full, this client's share of
        it is taken, ``refuse(model, ...)`` is called, or ``hold_s`` passes."""
        q = self.queues.setdefault(model, deque())
        if len(q) >= self.max_queue:
            raise Refused(
                503,
                f"model {model!r} is not served now ({why}) and {len(q)} requests wait for it already "
                f"(door.max_queue {self.max_queue})",
                retry_after=min(self.hold_s, 5.0),
                kind="queue_full",
            )
        if sum(1 for w in q if w.client == client) >= self.share():
            raise Refused(
                503,
                f"model {model!r} is not served now ({why}) and this client holds {self.share()} requests for it "
                "already (its share of door.max_queue)",
                retry_after=min(self.hold_s, 5.0),
                kind="client_share",
            )
        waiter = _Waiter(client, asyncio.get_running_loop().create_future())
        q.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=self.hold_s)
        except TimeoutError:
            raise Refused(
                503,
                f"model {model!r} was not served within door.hold_s ({self.hold_s:g} s): {why}",
                retry_after=self.hold_s,
                kind="hold_timeout",
            ) from None
        finally:
            if waiter in q:
                q.remove(waiter)
            if not q:
                self.queues.pop(model, None)
        return time.monotonic() - waiter.since

    def release(self, model: str) -> int:
        """Send every request held for ``model``, oldest first (each resumes in that order)."""
        q = self.queues.get(model)
        n = 0
        for w in list(q or ()):
            if not w.future.done():
                w.future.set_result(None)
                n += 1
        return n

    def refuse(self, model: str, exc: Refused) -> int:
        """Answer every request held for ``model`` with ``exc`` now."""
        q = self.queues.get(model)
        n = 0
        for w in list(q or ()):
            if not w.future.done():
                w.future.set_exception(exc)
                n += 1
        return n
