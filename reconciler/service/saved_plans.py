"""Saved plans: the document ``plan --out FILE`` and ``plan(save=True)`` write (the plan and the fingerprint of what
it was made from), where the host keeps them by ``plan_id``, and reading one back for ``apply FILE|PLAN_ID``.

Called by ``reconciler.service.host_service.HostService`` (``plan``, ``saved_plan``, ``apply_saved``). Plans are
written 0600 through the one safe writer (``reconciler.base.fsafe``) and redacted; the host's store keeps them a day.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.base import fsafe
from reconciler.base.errors import ReconcilerError
from reconciler.base.redact import redact_data
from reconciler.plan.fingerprint import PLAN_FORMAT, Fingerprint, approval_json
from reconciler.store.state import checked_subdir, host_dir

if TYPE_CHECKING:
    from reconciler.model import DesiredState
    from reconciler.plan.actions import Plan


def plan_document(
    p: Plan, fingerprint: Fingerprint, desired: DesiredState, *, plan_id: str | None = None
) -> dict[str, Any]:
    """A saved plan: the plan (each action with the full specification of its recipe, ``approval_json``) and the
    fingerprint of what it was made from (redacted: reasons quote commands)."""
    doc = {
        "format": PLAN_FORMAT,
        "host": p.host,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint.to_json(),
        "plan": approval_json(p, desired),
    }
    if plan_id:
        doc["plan_id"] = plan_id
    return redact_data(doc)


def write_private(path: str, data: dict[str, Any], *, files: Any = None) -> None:
    """Write a plan as JSON, 0600, through the one safe writer (``reconciler.base.fsafe.write_out``): a planted
    symlink or file at ``path`` is replaced, never followed; a terminal or a pipe (``/dev/stdout``) is written to.
    ``files``: the caller's own (``reconciler.control``), written where the caller lives, else this process's."""
    try:
        if files is not None:
            files.write_json(path, data, indent=2, sort_keys=False)
        else:
            fsafe.write_out(path, json.dumps(data, indent=2, default=str) + "\n", what="the plan file")
    except OSError as exc:
        raise ReconcilerError(f"cannot write the plan to {path}: {exc.strerror or exc}") from None


def read_plan_document(path: str, *, files: Any = None) -> tuple[dict[str, Any], Fingerprint]:
    """A saved plan and its fingerprint; ReconcilerError when the file is not one, or when it is not the running
    user's own (another user could have written or could change what is applied). ``files``: as for
    ``write_private``."""
    try:
        data = (files or fsafe).read_json(path, what="the plan file")
    except FileNotFoundError:
        raise ReconcilerError(f"{path}: no such plan file (write one with `reconciler plan --out {path}`)") from None
    except fsafe.UnsafePath as exc:
        raise ReconcilerError(
            f"{exc}; nothing was applied. Write a plan of your own with `reconciler plan --out FILE`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReconcilerError(
            f"{path}: not a saved plan ({exc}); write one with `reconciler plan --out FILE`"
        ) from None
    if isinstance(data, dict) and (newer := _newer_format(data.get("format"))):
        raise ReconcilerError(
            f"{path}: a plan saved by a newer reconciler (format {newer!r}; this one reads {PLAN_FORMAT!r}); nothing "
            "was applied. Apply it with that release, or make a plan with this one: `reconciler plan --out FILE`"
        )
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise ReconcilerError(f"{path}: not a saved plan of this tool (format {PLAN_FORMAT!r} expected)")
    try:
        return data, Fingerprint.from_json(data.get("fingerprint") or {})
    except ValueError as exc:
        raise ReconcilerError(f"{path}: {exc}") from None


def _newer_format(value: object) -> str | None:
    """``value`` when it names a saved plan's format of a version after this release's (``reconciler-plan/N``)."""
    name, _, version = PLAN_FORMAT.rpartition("/")
    if isinstance(value, str) and value.startswith(name + "/"):
        n = value[len(name) + 1 :]
        if n.isdigit() and int(n) > int(version):
            return value
    return None


def save_plan(host: str, p: Plan, fp: Fingerprint, desired: DesiredState) -> str:
    """Keep a plan in the host's store under a new ``plan_id`` (older ones pruned first), and return the id."""
    import uuid  # here: with platform, 3 ms of every command's start, for a saved plan's name

    plan_id = uuid.uuid4().hex
    d = checked_subdir(host, "plans", create=True)
    prune_old_plans(d)
    write_private(str(d / f"{plan_id}.json"), plan_document(p, fp, desired, plan_id=plan_id))
    return plan_id


def stored_plan_path(host: str, plan_id: str) -> str:
    """Where the host keeps the plan ``plan_id``; ReconcilerError when it keeps none of that id."""
    try:
        path = str(checked_subdir(host, "plans", create=False) / f"{plan_id}.json")
    except FileNotFoundError:
        path = str(host_dir(host) / "plans" / f"{plan_id}.json")
    if not os.path.lexists(path):
        raise ReconcilerError(f"no saved plan {plan_id} on this host (plans are kept for a day; make a new one)")
    return path


def prune_old_plans(d: Path, *, max_age_s: float = 86400) -> None:
    """Saved plans older than a day go: a plan that old is stale anyway."""
    cutoff = time.time() - max_age_s
    for p in d.glob("*.json"):
        with contextlib.suppress(OSError):
            if p.stat().st_mtime < cutoff:
                p.unlink()
