"""Qualification evidence, kept under the host's state directory: one JSON file per ``reconciler qualify`` run, in
``evidence/RECIPE/``, named by its date and recipe hash (schema: ``schemas/evidence.schema.json``), failed runs
included. Never rewritten: a new qualification is a new file.

Written by ``reconciler.service.qualify``; read by ``reconciler evidence`` (``reconciler.service.evidence``) and by
the gate evaluation (``reconciler.plan.gates``). A file that cannot be read is listed as unreadable, with why.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from reconciler.base import fsafe
from reconciler.base.formats import format_problem, stamped, unstamped
from reconciler.store.state import StateError, checked_subdir, host_dir

DIR = "evidence"
EVIDENCE_FORMAT = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FILE_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{1,64}(-\d+)?\.json$")


def _recipe_dir(host: str, recipe: str, *, create: bool) -> Path:
    if not _NAME_RE.match(recipe):
        raise StateError(f"{recipe!r} is no recipe name (letters, digits, '.', '_' and '-')")
    base = checked_subdir(host, DIR, create=create)
    try:
        return fsafe.check_dir(base / recipe, what="the evidence directory", create=create)
    except fsafe.UnsafePath as exc:
        raise StateError(str(exc)) from None


def keep(host: str, record: dict[str, Any]) -> Path:
    """Write one qualification's record (never over another) and return its path."""
    recipe, digest = str(record["recipe"]), str(record["recipe_hash"])
    d = _recipe_dir(host, recipe, create=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(float(record.get("started") or time.time())))
    for n in range(100):
        path = d / f"{stamp}-{digest}{'' if n == 0 else f'-{n}'}.json"
        if path.exists():
            continue
        try:
            fsafe.write_atomic(path, _dumps(stamped(record, EVIDENCE_FORMAT)), replace=False)
        except FileExistsError:
            continue
        except OSError as exc:
            raise StateError(f"cannot write {path}: {exc.strerror or exc}") from None
        return path
    raise StateError(f"cannot name a new evidence file in {d}: 100 of this second exist")


def _dumps(data: Any) -> str:
    import json

    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def records(host: str, recipe: str | None = None) -> list[dict[str, Any]]:
    """Every kept record (of ``recipe``, or of all), oldest first, each with its ``file``; one that cannot be read
    is ``{"recipe", "file", "unreadable": why}``."""
    try:
        base = checked_subdir(host, DIR, create=False)
    except FileNotFoundError:
        return []
    names = [recipe] if recipe is not None else sorted(p.name for p in base.iterdir() if _NAME_RE.match(p.name))
    out: list[dict[str, Any]] = []
    for name in names:
        try:
            d = _recipe_dir(host, name, create=False)
        except FileNotFoundError:
            continue
        for path in sorted(d.iterdir()):
            if _FILE_RE.match(path.name):
                out.append(_read(name, path))
    out.sort(key=lambda r: (str(r.get("recipe")), float(r.get("started") or 0), str(r.get("file"))))
    return out


def _read(recipe: str, path: Path) -> dict[str, Any]:
    try:
        data = fsafe.read_json(path, what="the evidence file")
    except (OSError, ValueError, fsafe.UnsafePath) as exc:
        return {"recipe": recipe, "file": str(path), "unreadable": str(exc)}
    if not isinstance(data, dict):
        return {"recipe": recipe, "file": str(path), "unreadable": "not a JSON object"}
    if problem := format_problem(data, reads=EVIDENCE_FORMAT):
        return {"recipe": recipe, "file": str(path), "unreadable": problem}
    return {**unstamped(data), "file": str(path)}


def where(host: str) -> Path:
    """The evidence directory, for messages."""
    return host_dir(host) / DIR
