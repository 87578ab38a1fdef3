"""What this install of the reconciler keeps about a host between runs: its install id, the containers an operator
adopted, and the containers that passed their health check.

The install id is generated once per host (by the first ``apply`` or ``run``) and put on every container this
install creates; with the host's name it is what proves a container ours (docs/design.md, safety rule 9): labels alone
are not proof, since anyone can write them and an image's labels are inherited by every container made from it.

Kept under ``$RECONCILER_STATE_DIR`` (default ``/var/lib/reconciler``), which survives reboots, unlike the lock
directory; each directory and file is checked before use and written through ``reconciler.fsafe``. ``read_record``
and ``write_record`` are the way in for the other keepers of per-host files (``reconciler.history``). ``read_ownership`` is read-only and used by every observation; the writers are called under the host
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
from typing import Any

from reconciler import fsafe
from reconciler.errors import ReconcilerError
from reconciler.observed import Ownership

_ID_RE = re.compile(r"^[0-9a-f]{32}$")
ENV = "RECONCILER_STATE_DIR"
DEFAULT_DIR = "/var/lib/reconciler"


def state_dir() -> Path:
    """The state directory, not checked (``checked_host_dir`` checks it)."""
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def host_dir(host: str) -> Path:
    """The host's directory under the state directory, not checked: a path for messages and ``checked_host_dir``."""
    return state_dir() / host


class StateError(ReconcilerError):
    pass


def checked_host_dir(host: str, *, create: bool) -> Path:
    """The host's directory, checked like StrictModes (``reconciler.fsafe``), made 0700 where missing when
    ``create``. FileNotFoundError when missing and not ``create``; StateError when unsafe or unusable."""
    return _checked(host_dir(host), create=create)


def checked_subdir(host: str, name: str, *, create: bool) -> Path:
    """A directory under the host's (``plans``), checked and made like ``checked_host_dir``."""
    checked_host_dir(host, create=create)
    return _checked(host_dir(host) / name, create=create)


def _checked(path: Path, *, create: bool) -> Path:
    """``fsafe.check_dir`` on a directory of the state directory, its failures as StateError (a missing one, when
    not ``create``, stays FileNotFoundError)."""
    try:
        return fsafe.check_dir(
            path,
            what="the state directory",
            create=create,
            how=f"set {ENV} to a directory of the running user's own (mode 0700)",
        )
    except fsafe.UnsafePath as exc:
        raise StateError(str(exc)) from None
    except FileNotFoundError:
        if create:
            raise StateError(f"cannot make {path}: a component vanished meanwhile") from None
        raise
    except OSError as exc:
        raise StateError(
            f"cannot make {path}: {exc.strerror or exc} (the state directory is ${ENV}, default "
            f"{DEFAULT_DIR}; it must be writable by the reconciler)"
        ) from None


def write_record(host: str, name: str, data: Any) -> None:
    """Write ``name`` (a JSON file) under the host's directory, atomically and 0600 (``fsafe.write_json``)."""
    path = checked_host_dir(host, create=True) / name
    try:
        fsafe.write_json(path, data)
    except OSError as exc:
        raise StateError(
            f"cannot write {path}: {exc.strerror or exc} (the state directory is ${ENV}, default {DEFAULT_DIR}; "
            f"it must be writable by the reconciler)"
        ) from None


def read_record(host: str, name: str) -> dict[str, Any]:
    """``name`` under the host's directory as a JSON object: {} when it does not exist yet; StateError when it
    cannot be read, is not JSON, or is not safe to trust."""
    try:
        path = checked_host_dir(host, create=False) / name
    except FileNotFoundError:
        return {}
    try:
        data = fsafe.read_json(path, what="the state file")
    except FileNotFoundError:
        return {}
    except fsafe.UnsafePath as exc:
        raise StateError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise StateError(
            f"cannot read {path}: {exc}; move it aside to start over (containers become foreign)"
        ) from None
    return data if isinstance(data, dict) else {}


def read_ownership(host: str) -> Ownership:
    """The install id (None before the first apply) and the adopted and healthy container ids. Read-only."""
    raw = read_record(host, "install.json")
    install_id = raw.get("install_id")
    if install_id is not None and not (isinstance(install_id, str) and _ID_RE.match(install_id)):
        raise StateError(f"{host_dir(host) / 'install.json'}: install_id {install_id!r} is not 32 hex digits")
    containers = read_record(host, "containers.json")
    return Ownership(
        install_id=install_id if isinstance(install_id, str) else None,
        adopted=frozenset(str(c) for c in containers.get("adopted", []) or []),
        healthy=frozenset(str(c) for c in containers.get("healthy", []) or []),
    )


def ensure_install_id(host: str) -> str:
    """The host's install id, created (random, 128 bits) when there is none yet. Call under the host lock."""
    current = read_ownership(host).install_id
    if current:
        return current
    new = secrets.token_hex(16)
    write_record(host, "install.json", {"install_id": new, "host": host, "created": time.time()})
    return new


def _update_containers(host: str, *, add: dict[str, Iterable[str]], keep: Collection[str] | None) -> None:
    data = read_record(host, "containers.json")
    out: dict[str, list[str]] = {}
    for key in ("adopted", "healthy"):
        ids = {str(c) for c in data.get(key, []) or []}
        ids |= set(add.get(key, ()))
        if keep is not None:
            ids &= set(keep)  # forget containers that no longer exist, so the files do not grow forever
        out[key] = sorted(ids)
    write_record(host, "containers.json", out)


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
    path = checked_host_dir(host, create=True) / "ownership.log"
    line = json.dumps({"time": time.time(), **event}, sort_keys=True) + "\n"
    try:
        fd = fsafe.open_append(path, what="the ownership log")
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except fsafe.UnsafePath as exc:
        raise StateError(str(exc)) from None
    except OSError as exc:
        raise StateError(f"cannot append to {path}: {exc.strerror or exc}") from None
