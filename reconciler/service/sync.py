"""``reconciler sync`` (and ``POST /v1/sync``): the host's git source fetched now, its newest commit checked, and
taken as the commit in use when it may be (``reconciler.load.source_sync``, which the loop's timer calls too),
serialised with the loop and audited with its caller.

A commit is taken only when (1) its files validate as a local root's would with this host file (``load_desired``
with that commit): a commit that does not is *refused*, the commit in use kept, the error naming the commit and the
file; and (2), with ``source.after``, every canary host reports that very commit converged (``GET /v1/status`` with
its token, read as ``reconciler fleet status`` reads it). While a canary has not got there the commit *waits*; one
that leaves a canary blocked, held in backoff or refusing it *stops* the commit here, for good: only a newer commit
(a fix, or a revert) goes on. Each taken, refused or stopped commit is audited once, with its caller.

Taking a commit changes the desired state only: the loop (or the next ``apply``) converges it under every rule a
local edit meets. Called by ``reconciler.service.host_service.HostService.sync``, with its ``CallContext``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.load.source_sync import sync_held
from reconciler.store.source import SourceRecord

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


class SyncRefused(ReconcilerError):
    """There is nothing to sync: the host file names no source."""

    code = "sync_refused"


@dataclass(frozen=True)
class SyncResult:
    host: str
    before: str | None
    record: SourceRecord

    @property
    def taken(self) -> bool:
        return self.record.commit != self.before

    @property
    def exit_code(self) -> int:
        """0 while the newest commit is in use or waits for its canaries; 1 when it is refused or stopped, or the
        repository did not answer."""
        return 0 if self.record.state in ("following", "waiting") else 1

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "before": self.before, "taken": self.taken, "source": self.record.to_json()}


def sync_source(ctx: CallContext) -> SyncResult:
    host = ctx.host()
    src = host.source
    if src is None:
        why = "configs/host.yaml names no source: (source: {git: URL, ref: BRANCH, path: DIR}); nothing to sync"
        ctx.record_refusal("sync", why, host=host.name)
        raise SyncRefused(why)
    with ctx.exclusive(host.name, "sync"):
        before, record = sync_held(ctx.root, host, lambda **fields: ctx.record(host.name, "sync", **fields))
    return SyncResult(host.name, before, record)
