"""What the host keeps of its git source (``source:`` of configs/host.yaml), under its state directory:

- ``source/repo.git``: a bare clone of the repository, fetched by ``reconciler.load.git_source``;
- ``source-trees/COMMIT/``: the files of one commit the tool reads (``manifests/*.yaml``, ``configs/recipes/*.toml``
  of the source's path), written by the tool itself from the commit's blobs, never checked out by git;
- ``source.json``: the record, ``SourceRecord``: the commit in use (the one ``plan``, ``apply``, ``status`` and the
  loop read), the newest fetched, and what held a newer one back (refused: its files do not validate; waiting or
  stopped: the canaries of ``after``).

Written by ``reconciler.service.sync`` under the host lock (or the loop's pass lock), read by every command that
loads the desired state.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.store.state import checked_subdir, read_record, write_record

RECORD = "source.json"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")  # SHA-1, or SHA-256 where a repository uses it


@dataclass(frozen=True)
class SourceRecord:
    """``source.json``: the commit in use and the newest one's fate. Every commit is git's full hex name."""

    url: str = ""
    ref: str = ""
    path: str = ""
    commit: str | None = None  # in use
    fetched: str | None = None  # the newest fetched
    fetched_at: float | None = None  # when the last fetch answered (time.time())
    synced_at: float | None = None  # when the commit in use was taken
    error: str = ""  # why the last fetch failed ("" when it answered)
    refused: dict[str, Any] | None = None  # {"commit", "problems": [str]}: a commit whose files do not validate
    waiting: dict[str, Any] | None = None  # {"commit", "canaries": {host: why}}: for the canaries of after
    stopped: dict[str, Any] | None = None  # {"commit", "canary", "why"}: a canary failed it; nothing goes further
    history: list[dict[str, Any]] = field(default_factory=list)  # the last commits taken: {"commit", "at"}

    @property
    def state(self) -> str:
        """following (the newest commit is in use), waiting, stopped, refused, unreachable, or unfetched."""
        if self.stopped is not None:
            return "stopped"
        if self.refused is not None and self.refused.get("commit") == self.fetched:
            return "refused"
        if self.waiting is not None:
            return "waiting"
        if self.error:
            return "unreachable"
        if self.commit is None:
            return "unfetched"
        return "following"

    def for_source(self, url: str, ref: str, path: str) -> SourceRecord:
        """This record when it is of that source; a blank one when the host file names another (nothing of the old
        source's commits is used for the new one)."""
        if (self.url, self.ref, self.path) == (url, ref, path):
            return self
        return SourceRecord(url=url, ref=ref, path=path)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state}


def _commit(v: Any) -> str | None:
    return v if isinstance(v, str) and COMMIT_RE.match(v) else None


def read_source_record(host: str) -> SourceRecord:
    """The record, or a blank one; a commit that is no full hex name is dropped (never passed on to git)."""
    data = read_record(host, RECORD)
    if not data:
        return SourceRecord()

    def obj(key: str) -> dict[str, Any] | None:
        v = data.get(key)
        return v if isinstance(v, dict) and _commit(v.get("commit")) else None

    def num(key: str) -> float | None:
        v = data.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return SourceRecord(
        url=str(data.get("url") or ""),
        ref=str(data.get("ref") or ""),
        path=str(data.get("path") or ""),
        commit=_commit(data.get("commit")),
        fetched=_commit(data.get("fetched")),
        fetched_at=num("fetched_at"),
        synced_at=num("synced_at"),
        error=str(data.get("error") or ""),
        refused=obj("refused"),
        waiting=obj("waiting"),
        stopped=obj("stopped"),
        history=[h for h in data.get("history") or [] if isinstance(h, dict) and _commit(h.get("commit"))][-20:],
    )


def write_source_record(host: str, record: SourceRecord) -> None:
    write_record(host, RECORD, asdict(record))


def source_dir(host: str, *, create: bool) -> Path:
    """The host's ``source`` directory, checked (made 0700 when ``create``)."""
    return checked_subdir(host, "source", create=create)


def trees_dir(host: str, *, create: bool) -> Path:
    """The host's ``source-trees`` directory (one folder per commit read), checked like ``source_dir``."""
    return checked_subdir(host, "source-trees", create=create)


# The commit each host's desired state was last loaded from in this process (None: its root's own files), set by
# ``reconciler.load.desired.load_desired``: every audit record of the host carries it (``reconciler.store.audit``).
_IN_USE: dict[str, str | None] = {}


def note_in_use(host: str, commit: str | None) -> None:
    _IN_USE[host] = commit


def commit_in_use(host: str) -> str | None:
    return _IN_USE.get(host)
