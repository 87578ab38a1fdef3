"""``reconciler shm reclaim``: the guarded cleanup of orphan offload files, a dry run unless confirmed; confirmed, it
is serialised with the loop, counted by a running loop's hooks and audited.

Called by ``reconciler.service.host_service.HostService.shm_reclaim``, with its ``CallContext``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from reconciler.apply.host_io import REAL_IO
from reconciler.apply.shm_guard import reclaim
from reconciler.service.results import ReclaimOutcome
from reconciler.store.state import read_ownership

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def shm_reclaim(ctx: CallContext, *, confirm: bool, paths: list[str] | None = None) -> ReclaimOutcome:
    """The guarded cleanup: a dry run unless ``confirm``; with ``paths``, nothing outside them is removed."""
    host = ctx.host()
    io = ctx.io or REAL_IO
    observer = io.engine(host)
    settled = lambda: read_ownership(host.name).healthy  # noqa: E731 - read afresh for each inspection
    if not confirm:
        return ReclaimOutcome(
            reclaim(
                host.shm,
                observe_docker=observer.observe,
                confirm=False,
                only_paths=paths,
                settled=settled,
                io=io.shm,
                clock=io.clock,
            )
        )
    t0 = time.monotonic()
    with ctx.exclusive(host.name, "shm reclaim"):
        result = reclaim(
            host.shm,
            observe_docker=observer.observe,
            confirm=True,
            only_paths=paths,
            settled=settled,
            io=io.shm,
            clock=io.clock,
        )
    if ctx.hooks:
        ctx.hooks.shm_reclaim(result)
    ctx.record(
        host.name,
        "shm-reclaim",
        outcome="refused" if result.refused else ("ok" if result.ok else "failed"),
        reason=result.refused or f"{len(result.reclaimed)} orphan offload file(s)",
        bytes_freed=int(result.reclaimed_bytes),
        paths=[r.path for r in result.reclaimed],
        seconds=round(time.monotonic() - t0, 3),
    )
    return ReclaimOutcome(result)
