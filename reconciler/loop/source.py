"""The loop's side of the host's git source (``source:`` of the host file): a fetch every ``source.interval_s`` and at
once on ``POST /v1/sync`` or ``reconciler sync`` answered by the loop (the trigger ``sync``), each through
``reconciler.load.source_sync`` with the host lock the loop holds, audited as the loop's, logged, and exported
(``reconciler_git_*``). A commit taken changes the desired state the very pass that follows reads; one refused,
waiting or stopped keeps the commit in use, so nothing is torn down for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.base.clock import REAL_CLOCK, Clock
from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.load.host_file import load_host
from reconciler.load.source_sync import sync_held
from reconciler.model import HostConfig
from reconciler.store.audit import audit_log
from reconciler.store.source import read_source_record

if TYPE_CHECKING:
    from reconciler.loop.log import Log
    from reconciler.loop.metrics import Metrics


class SourceFollower:
    """When the loop fetches, and what a fetch did."""

    def __init__(self, root: str, *, log: Log, metrics: Metrics, clock: Clock = REAL_CLOCK):
        self.root = root
        self.log = log
        self.metrics = metrics
        self.clock = clock  # the loop's (``HostIO.clock``): its fetch timer runs on the host's monotonic clock
        self.interval_s: float | None = None  # the source's, once a host file naming one was read
        self._next = 0.0  # monotonic time of the next fetch: at once
        self._said: dict[str, Any] = {}  # the last fetch's line in the log

    def _host(self) -> HostConfig | None:
        try:
            host = load_host(self.root)
        except (ConfigError, ReconcilerError):
            return None
        self.interval_s = host.source.interval_s if host.source is not None else None
        return host

    def due_in(self) -> float | None:
        """Seconds until the next fetch (0 when due); None when the host file names no source."""
        if self.interval_s is None:
            return None
        return max(0.0, self._next - self.clock.monotonic())

    def needs_first(self) -> bool:
        """Whether the host file names a source of which no commit is in use yet (the loop then fetches before it
        can load anything)."""
        host = self._host()
        if host is None or host.source is None:
            return False
        src = host.source
        return read_source_record(host.name).for_source(src.git, src.ref, src.path).commit is None

    def follow(self, reasons: set[str]) -> bool:
        """Fetch when due or asked (``sync`` in ``reasons``); whether a new commit was taken."""
        host = self._host()
        if host is None or host.source is None:
            return False
        if "sync" not in reasons and self.clock.monotonic() < self._next:
            return False
        self._next = self.clock.monotonic() + host.source.interval_s
        try:
            before, record = sync_held(self.root, host, self._audit(host.name))
        except ReconcilerError as exc:  # the state directory: said, and tried again at the next fetch
            self.log("source-error", error=str(exc))
            return False
        self.metrics.set_git_source(
            commit=record.commit, ref=record.ref, state=record.state, fetched_at=record.fetched_at
        )
        fields: dict[str, Any] = {"state": record.state, "commit": (record.commit or "")[:12]}
        if record.fetched and record.fetched != record.commit:
            fields["newest"] = record.fetched[:12]
        if record.error:
            fields["error"] = record.error
        taken = record.commit != before
        if taken or fields != self._said:  # a fetch that changed nothing is not logged again every interval
            self.log("source-sync" if taken else "source-fetched", **fields)
            self._said = fields
        return taken

    def _audit(self, host: str) -> Any:
        def write(**fields: Any) -> None:
            try:
                audit_log(host).append({"front": "loop", "who": "", "action": "sync", **fields})
            except ReconcilerError as exc:
                self.log("audit-error", error=str(exc))

        return write
