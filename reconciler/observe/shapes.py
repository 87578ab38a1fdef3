"""The JSON shapes of docs/design.md, "JSON output" (a contract: keys are only ever added), built from plain observation values.

Pure apart from redaction. Used by the service layer (every front-end's JSON), the CLI's renderers and the
stand-alone inspector ``python -m reconciler.observe.shm``; it imports no front-end.
"""

from __future__ import annotations

import functools
from typing import Any

from reconciler.base.redact import redact_cmdline
from reconciler.plan.observed import ShmFile, ShmView

# The owners of one file are often thousands of processes of a few command lines: each line is redacted once.
_redact_command = functools.lru_cache(maxsize=4096)(redact_cmdline)


def file_json(f: ShmFile) -> dict[str, Any]:
    return {
        "path": f.path,
        "dev": f.dev,
        "inode": f.inode,
        "size_bytes": f.size_bytes,
        "allocated_bytes": f.allocated_bytes,
        "owners": [
            {"pid": o.pid, "container": o.container, "via": o.via, "command": _redact_command(o.command)}
            for o in f.owners
        ],
        "state": f.state,
        "reason": f.reason,
    }


def status_json(view: ShmView) -> dict[str, Any]:
    """The ``shm status --json`` shape of docs/design.md, plus unlinked-but-held files, uninspectable pids, skipped entries."""
    return {
        "dir": view.dir,
        "pattern": view.pattern,
        "tmpfs": {
            "size_bytes": view.tmpfs.size_bytes,
            "used_bytes": view.tmpfs.used_bytes,
            "free_bytes": view.tmpfs.free_bytes,
        },
        "sources": {"proc": redact_cmdline(view.proc.render()), "docker": redact_cmdline(view.docker.render())},
        "blocking_containers": list(view.blocking_containers),
        "files": [file_json(f) for f in view.files],
        "deleted_mapped_bytes": view.deleted_mapped_bytes,
        "deleted_mapped": [file_json(f) for f in view.deleted_mapped],
        "uninspectable": [
            {"pid": u.pid, "command": redact_cmdline(u.command), "reason": u.reason, "excused": u.excused}
            for u in view.uninspectable
        ],
        "skipped": [{"path": p, "reason": why} for p, why in view.skipped],
    }
