"""What this install of the reconciler keeps about a host between runs: its install id, the containers an operator
adopted, and the containers that passed their health check.

The install id is generated once per host (by the first ``apply`` or ``run``) and put on every container this
install creates; with the host's name it is what proves a container ours (DESIGN.md safety rule 9): labels alone
are not proof, since anyone can write them and an image's labels are inherited by every container made from it.

Kept under ``$RECONCILER_STATE_DIR`` (default ``/var/lib/reconciler``), which survives reboots, unlike the lock
directory. ``read_ownership`` is read-only and used by every observation; the writers are called under the host
lock by the apply layer (``ensure_install_id``, ``mark_healthy``) and by ``reconciler adopt``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from reconciler.errors import ReconcilerError
from reconciler.observed import Ownership

_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def state_dir() -> Path:
    return Path(os.environ.get("RECONCILER_STATE_DIR", "/var/lib/reconciler"))


def host_dir(host: str) -> Path:
    return state_dir() / host


class StateError(ReconcilerError):
    pass


def _write_json(path: Path, data: object) -> None:
    """Atomically (a temp file renamed over the old one), mode 0600."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise StateError(
            f"cannot write {path}: {exc.strerror or exc} (the state directory is $RECONCILER_STATE_DIR, "
            f"default /var/lib/reconciler; it must be writable by the reconciler)"
        ) from None


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read {path}: {exc}; move it aside to start over (containers become foreign)") from None
    return data if isinstance(data, dict) else {}


def read_ownership(host: str) -> Ownership:
    """The install id (None before the first apply) and the adopted and healthy container ids. Read-only."""
    d = host_dir(host)
    raw = _read_json(d / "install.json")
    install_id = raw.get("install_id")
    if install_id is not None and not (isinstance(install_id, str) and _ID_RE.match(install_id)):
        raise StateError(f"{d / 'install.json'}: install_id {install_id!r} is not 32 hex digits")
    containers = _read_json(d / "containers.json")
    return Ownership(
        install_id=install_id if isinstance(install_id, str) else None,
        adopted=frozenset(str(c) for c in containers.get("adopted", []) or []),  # type: ignore[union-attr]
        healthy=frozenset(str(c) for c in containers.get("healthy", []) or []),  # type: ignore[union-attr]
    )


def ensure_install_id(host: str) -> str:
    """The host's install id, created (random, 128 bits) when there is none yet. Call under the host lock."""
    current = read_ownership(host).install_id
    if current:
        return current
    new = secrets.token_hex(16)
    _write_json(host_dir(host) / "install.json", {"install_id": new, "host": host, "created": time.time()})
    return new


def _update_containers(host: str, *, add: dict[str, Iterable[str]], keep: Collection[str] | None) -> None:
    path = host_dir(host) / "containers.json"
    data = _read_json(path)
    out: dict[str, list[str]] = {}
    for key in ("adopted", "healthy"):
        ids = {str(c) for c in data.get(key, []) or []}  # type: ignore[union-attr]
        ids |= set(add.get(key, ()))
        if keep is not None:
            ids &= set(keep)  # forget containers that no longer exist, so the files do not grow forever
        out[key] = sorted(ids)
    _write_json(path, out)


def mark_healthy(host: str, container_id: str, *, existing: Collection[str] | None = None) -> None:
    """Record that a container of ours passed its health check (a running one that never did is not satisfied)."""
    _update_containers(host, add={"healthy": [container_id]}, keep=existing)


def adopt(host: str, container_ids: Iterable[str], *, existing: Collection[str] | None = None) -> None:
    """Record containers as this install's, by an operator's explicit command. They count as healthy too: the
    operator vouches for a lane that was serving before the upgrade."""
    ids = list(container_ids)
    _update_containers(host, add={"adopted": ids, "healthy": ids}, keep=existing)


def record(host: str, event: dict[str, object]) -> None:
    """Append one JSON line to the host's log of ownership decisions (``adopt``), never rewriting it."""
    path = host_dir(host) / "ownership.log"
    line = json.dumps({"time": time.time(), **event}, sort_keys=True) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as exc:
        raise StateError(f"cannot append to {path}: {exc.strerror or exc}") from None
