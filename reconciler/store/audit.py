"""The audit trail: every action any front-end (cli, api, mcp) or the loop took, one JSON line each.

Written by the service layer and the loop, read by ``reconciler audit`` and ``GET /v1/audit``. The file
(``$RECONCILER_STATE_DIR/HOST/audit.jsonl``) is only ever appended to; past ``max_bytes`` it is rotated
(``audit.jsonl.1`` … ``.KEEP``, the oldest dropped), never rewritten. Records are redacted like every other output.
The directory is checked and the files opened through ``reconciler.base.fsafe`` (no symlink followed, ours only).
Each line carries its format version (``reconciler.base.formats``); a line of a newer format is read as a record that
says so, never guessed at.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reconciler.base import fsafe
from reconciler.base.errors import ReconcilerError
from reconciler.base.formats import format_problem, stamped, unstamped
from reconciler.base.redact import redact_data
from reconciler.store.source import commit_in_use
from reconciler.store.state import checked_host_dir, host_dir

MAX_BYTES = 10 << 20
KEEP = 5
AUDIT_FORMAT = 1  # the format version of a line: this release writes it, and reads it and every older one


class AuditLog:
    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES, keep: int = KEEP, host: str | None = None):
        self.host = host  # whose records: each carries the commit of the host's git source in use, where it has one
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep

    def _rotated(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Add one record (``time`` is set here) and return it as written."""
        commit = commit_in_use(self.host) if self.host is not None else None
        extra = {"commit": commit} if commit is not None and "commit" not in record else {}
        entry = redact_data({"time": round(time.time(), 3), **record, **extra})
        line = (json.dumps(stamped(entry, AUDIT_FORMAT), sort_keys=True, default=str) + "\n").encode()
        try:
            lock_fd = fsafe.open_append(self.path.with_name(f".{self.path.name}.lock"), what="the audit lock file")
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)  # rotation and append, one writer at a time across processes
                try:
                    size = self.path.lstat().st_size
                except FileNotFoundError:
                    size = 0
                if size and size + len(line) > self.max_bytes:
                    self._rotate()
                fd = fsafe.open_append(self.path, what="the audit log")
                try:
                    end = os.fstat(fd).st_size
                    if end and os.pread(fd, 1, end - 1) != b"\n":
                        line = b"\n" + line  # a line cut by a crash stays alone: this record is not lost with it
                    os.write(fd, line)
                finally:
                    os.close(fd)
            finally:
                os.close(lock_fd)
        except ReconcilerError as exc:
            raise ReconcilerError(f"cannot append to the audit log: {exc}") from None
        except OSError as exc:
            raise ReconcilerError(f"cannot append to the audit log {self.path}: {exc.strerror or exc}") from None
        return entry

    def _rotate(self) -> None:
        oldest = self._rotated(self.keep)
        if oldest.exists():
            oldest.unlink()
        for n in range(self.keep - 1, 0, -1):
            if self._rotated(n).exists():
                self._rotated(n).rename(self._rotated(n + 1))
        self.path.rename(self._rotated(1))

    def _lines(self) -> Iterator[str]:
        for p in [*(self._rotated(n) for n in range(self.keep, 0, -1)), self.path]:
            try:
                with (
                    fsafe.open_trusted(p, what="the audit log") as fd,
                    open(os.dup(fd), encoding="utf-8", errors="replace") as fh,
                ):
                    yield from fh
            except FileNotFoundError:
                continue

    def read(self, *, since: float | None = None) -> list[dict[str, Any]]:
        """Every record, oldest first (rotated files included); with ``since``, those at or after that time."""
        out = []
        for line in self._lines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash mid-write: skipped, never fatal
            if not isinstance(rec, dict):
                continue
            if problem := format_problem(rec, reads=AUDIT_FORMAT):
                rec = {"time": rec.get("time"), "outcome": "unreadable", "detail": f"an audit record: {problem}"}
            if since is None or float(rec.get("time") or 0) >= since:
                out.append(unstamped(rec))
        return out


def audit_log(host: str, *, create: bool = True) -> AuditLog:
    """The host's audit trail, in its checked state directory (``reconciler.store.state.checked_host_dir``)."""
    try:
        return AuditLog(checked_host_dir(host, create=create) / "audit.jsonl", host=host)
    except FileNotFoundError:
        return AuditLog(host_dir(host) / "audit.jsonl", host=host)  # nothing recorded yet: reads find no file
