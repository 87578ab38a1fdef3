"""What a plan was made from, as a fingerprint: the operator's files, the containers, the GPU processes and the
offload files. Two fingerprints that differ say which of these changed.

Used by ``reconciler plan --out FILE`` (saved with the plan), ``reconciler apply FILE`` (a stale plan is refused
with what changed) and the interactive ``apply`` (the host or the files changed between showing the plan and the
approval: stop and show the new one). ``observed_parts`` is pure; ``file_digests`` reads the root's files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.observed import LABEL_PREFIX, Observed

PLAN_FORMAT = "reconciler-plan/1"


def file_digests(root: str | Path) -> dict[str, str]:
    """sha256 of every file the desired state is loaded from, by its path relative to the root."""
    r = Path(root)
    paths = [r / "configs" / "host.yaml", *sorted((r / "configs" / "recipes").glob("*.toml"))]
    paths += sorted([*(r / "manifests").glob("*.yaml"), *(r / "manifests").glob("*.yml")])
    out: dict[str, str] = {}
    for p in paths:
        try:
            out[str(p.relative_to(r))] = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError as exc:
            out[str(p.relative_to(r))] = f"unreadable: {exc.strerror or exc}"
    return out


def observed_parts(observed: Observed) -> dict[str, list[str]]:
    """Pure: the facts of an observation that a plan depends on, as sorted lines per part. Every part is present
    also when it is empty, so "nothing was running" is a fact that a later start changes."""
    # Only containers a plan can depend on: any with GPUs or native offload (they hold slots or forbid reclaims)
    # and any carrying this tool's labels. A busy engine's unrelated containers do not make a saved plan stale.
    containers = sorted(
        f"{c.name} {c.id[:12]} {c.state} {c.image} "
        + hashlib.sha256(json.dumps(c.labels, sort_keys=True).encode()).hexdigest()[:12]
        + f" gpus={','.join(c.gpu_devices)} offload={c.offload}"
        for c in observed.containers
        if c.gpu_devices or c.offload or any(k.startswith(LABEL_PREFIX) for k in c.labels)
    )
    gpus = sorted(
        f"{slot} {'missing' if v.missing else 'present'} "
        + ",".join(f"pid {p.pid} in {p.container_id[:12] if p.container_id else '-'}" for p in v.processes)
        for slot, v in observed.gpus.slots.items()
    )
    shm = sorted(f"{f.path} dev={f.dev} inode={f.inode} size={f.size_bytes} {f.state}" for f in observed.shm.files)
    sources = sorted(f"{s.name} {'ok' if s.ok else 'unavailable'}" for s in observed.sources.values())
    return {"containers": containers, "gpus": gpus, "shm": shm, "sources": sources}


@dataclass(frozen=True)
class Fingerprint:
    files: dict[str, str]
    parts: dict[str, list[str]]

    @property
    def digest(self) -> str:
        blob = json.dumps({"files": self.files, "parts": self.parts}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "files": self.files, "parts": self.parts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        files = data.get("files")
        parts = data.get("parts")
        if not isinstance(files, dict) or not isinstance(parts, dict):
            raise ValueError("fingerprint without 'files' and 'parts'")
        return cls(
            files={str(k): str(v) for k, v in files.items()},
            parts={str(k): [str(x) for x in v] for k, v in parts.items()},
        )

    def changes_since(self, before: Fingerprint) -> list[str]:
        """Pure: what differs from ``before``, one line each (empty when nothing does)."""
        out: list[str] = []
        for name in sorted(set(before.files) | set(self.files)):
            old, new = before.files.get(name), self.files.get(name)
            if old != new:
                out.append(f"{name} " + ("added" if old is None else "removed" if new is None else "edited"))
        for part in sorted(set(before.parts) | set(self.parts)):
            old_lines, new_lines = set(before.parts.get(part, [])), set(self.parts.get(part, []))
            for line in sorted(old_lines - new_lines):
                out.append(f"{part}: no longer {line}")
            for line in sorted(new_lines - old_lines):
                out.append(f"{part}: now {line}")
        return out


def fingerprint(root: str | Path, observed: Observed) -> Fingerprint:
    return Fingerprint(files=file_digests(root), parts=observed_parts(observed))
