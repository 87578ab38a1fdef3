"""What a guarded reclaim reports: each file it removed (``RemovedFile``), each it kept and why (``KeptFile``), and
the whole reclaim (``ReclaimResult``, with its exit status and JSON).

Made by ``reconciler.apply.shm_guard`` and its last gate ``reconciler.apply.shm_unlink``; read by the command
line's ``shm`` commands, the service, the apply layer and the loop's metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from reconciler.plan.observed import Tmpfs

# Why a guarded reclaim, or one file of it, was refused, in one word: the reasons reconciler_refusals_total counts
# (reconciler.loop.metric_families.REFUSAL_REASONS holds their help; tests/test_loop keeps the two in step). Each is
# set where the refusal is made and carried as data; no layer reads it back from the sentence beside it.
RefusalCode = Literal[
    "source_unavailable",
    "uninspectable_process",
    "offload_container_running",
    "inspections_disagree",
    "file_owned",
    "lease_refused",
    "invalid_entry",
]
REFUSAL_CODES: tuple[RefusalCode, ...] = get_args(RefusalCode)


@dataclass(frozen=True)
class RemovedFile:
    path: str
    size_bytes: int
    allocated_bytes: int
    dev: int
    inode: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size_bytes": self.size_bytes,
            "allocated_bytes": self.allocated_bytes,
            "dev": self.dev,
            "inode": self.inode,
        }


@dataclass(frozen=True)
class KeptFile:
    path: str
    reason: str
    state: str = ""  # the file's state in the last inspection; "skipped" for refused entries
    # The refusal keeping it is (a RefusalCode: the kernel's write lease said no, the inspections disagreed, it
    # gained an owner, it is no plain file of shm.dir); "" when keeping it refused nothing (owned all along, gone,
    # not asked for).
    code: RefusalCode | Literal[""] = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason, "state": self.state, "code": self.code}


@dataclass(frozen=True)
class ReclaimResult:
    """What a reclaim did (``confirmed``) or would do (a dry run), and why each other file stayed."""

    confirmed: bool
    dir: str
    pattern: str
    # Removed and verified gone (with confirm); empty in a dry run.
    reclaimed: tuple[RemovedFile, ...] = ()
    # What a dry run would remove (the orphans of its one inspection); with confirm, the first inspection's.
    candidates: tuple[RemovedFile, ...] = ()
    kept: tuple[KeptFile, ...] = ()
    verified: bool = False
    # Why nothing at all was removed: an unavailable source or a running native-offload container; and its code.
    refused: str | None = None
    refused_code: RefusalCode | None = None
    sources: dict[str, str] = field(default_factory=dict)
    blocking_containers: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    tmpfs_before: Tmpfs | None = None
    tmpfs_after: Tmpfs | None = None
    inspections: int = 0
    elapsed_s: float = 0.0

    @property
    def reclaimed_bytes(self) -> int:
        return sum(f.allocated_bytes for f in self.reclaimed)

    @property
    def candidate_bytes(self) -> int:
        return sum(f.allocated_bytes for f in self.candidates)

    @property
    def ok(self) -> bool:
        """Exit 0: not refused, no error, and (with confirm) every removal verified."""
        return self.refused is None and not self.errors and (self.verified or not self.confirmed)

    def to_json(self) -> dict[str, Any]:
        def tmpfs(t: Tmpfs | None) -> dict[str, int] | None:
            if t is None:
                return None
            return {"size_bytes": t.size_bytes, "used_bytes": t.used_bytes, "free_bytes": t.free_bytes}

        return {
            "confirmed": self.confirmed,
            "reclaimed": [f.to_json() for f in self.reclaimed],
            "kept": [k.to_json() for k in self.kept],
            "reclaimed_bytes": self.reclaimed_bytes,
            "verified": self.verified,
            "dir": self.dir,
            "pattern": self.pattern,
            "would_reclaim": [] if self.confirmed else [f.to_json() for f in self.candidates],
            "would_reclaim_bytes": 0 if self.confirmed else self.candidate_bytes,
            "refused": self.refused,
            "sources": dict(self.sources),
            "blocking_containers": list(self.blocking_containers),
            "errors": list(self.errors),
            "tmpfs_before": tmpfs(self.tmpfs_before),
            "tmpfs_after": tmpfs(self.tmpfs_after),
            "inspections": self.inspections,
            "elapsed_s": round(self.elapsed_s, 3),
        }
