"""What this install of the reconciler keeps about a host between runs: its install id, the containers it created,
the containers an operator adopted, and the containers that passed their health check.

The install id is generated once per host (by the first ``apply`` or ``run``) and put on every container this
install creates; with the host's name and the container's id recorded at create (``record_pending`` before the
create, ``record_created`` after it), it is what proves a container ours (docs/design.md, safety rule 9): labels alone
are not proof, since anyone can write or copy them and an image's labels are inherited by every container made from
it. ``migrate_created`` records, once, the containers of an install made before that record.

Kept under ``$RECONCILER_STATE_DIR`` (default ``/var/lib/reconciler``), which survives reboots, unlike the lock
directory; each directory and file is checked before use and written through ``reconciler.base.fsafe``. ``read_record``
and ``write_record`` are the way in for the other keepers of per-host files (``reconciler.store.history``). ``read_ownership`` is read-only and used by every observation; the writers are called under the host
lock by the apply layer (``ensure_install_id``, ``record_pending``, ``record_created``, ``settle_created``,
``migrate_created``, ``mark_healthy``) and by ``reconciler adopt``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from reconciler.base import fsafe
from reconciler.base.errors import ReconcilerError
from reconciler.base.formats import format_problem, stamped, unstamped
from reconciler.plan.observed import Ownership

_ID_RE = re.compile(r"^[0-9a-f]{32}$")
ENV = "RECONCILER_STATE_DIR"
DEFAULT_DIR = "/var/lib/reconciler"
# The format version of every record under the state directory and of each line of the ownership log
# (``reconciler.base.formats``): this release writes it and reads it and every older one.
RECORD_FORMAT = 1


def state_dir() -> Path:
    """The state directory, not checked (``checked_host_dir`` checks it)."""
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def host_dir(host: str) -> Path:
    """The host's directory under the state directory, not checked: a path for messages and ``checked_host_dir``."""
    return state_dir() / host


class StateError(ReconcilerError):
    code = "state"
    pass


def checked_host_dir(host: str, *, create: bool) -> Path:
    """The host's directory, checked like StrictModes (``reconciler.base.fsafe``), made 0700 where missing when
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


def write_record(host: str, name: str, data: dict[str, Any]) -> None:
    """Write ``name`` (a JSON object) under the host's directory, atomically and 0600 (``fsafe.write_json``), with
    its format version."""
    path = checked_host_dir(host, create=True) / name
    try:
        fsafe.write_json(path, stamped(data, RECORD_FORMAT))
    except OSError as exc:
        raise StateError(
            f"cannot write {path}: {exc.strerror or exc} (the state directory is ${ENV}, default {DEFAULT_DIR}; "
            f"it must be writable by the reconciler)"
        ) from None


def read_record(host: str, name: str) -> dict[str, Any]:
    """``name`` under the host's directory as a JSON object (without its format version): {} when it does not exist
    yet; StateError when it cannot be read, is not JSON, is not safe to trust or is of a newer format."""
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
    if not isinstance(data, dict):
        return {}
    if problem := format_problem(data, reads=RECORD_FORMAT):
        raise StateError(f"cannot read {path}: {problem}; nothing was changed")
    return unstamped(data)


# install.json's mark that this install records the id of every container it creates (containers.json "created").
# An install made before that has no mark: its first apply records the containers that carry its labels then, once.
RECORDS_CREATED = "records_created"
# How many creates whose answer never came are remembered (each is matched, or its create never took effect).
MAX_PENDING = 32


def read_ownership(host: str) -> Ownership:
    """The install id (None before the first apply), the ids of the containers it created (None while an install
    from before that record awaits its one migration), the adopted and healthy container ids, and the creates whose
    answer was lost. Read-only."""
    raw = read_record(host, "install.json")
    install_id = raw.get("install_id")
    if install_id is not None and not (isinstance(install_id, str) and _ID_RE.match(install_id)):
        raise StateError(f"{host_dir(host) / 'install.json'}: install_id {install_id!r} is not 32 hex digits")
    containers = read_record(host, "containers.json")
    created: frozenset[str] | None = frozenset(str(c) for c in containers.get("created", []) or [])
    if install_id is not None and raw.get(RECORDS_CREATED) is not True:
        created = None  # an install from before the record: migrated by its first apply (migrate_created)
    pending = frozenset(
        (str(p.get("name")), str(p.get("token")))
        for p in containers.get("pending", []) or []
        if isinstance(p, dict) and p.get("name") and p.get("token")
    )
    return Ownership(
        install_id=install_id if isinstance(install_id, str) else None,
        adopted=frozenset(str(c) for c in containers.get("adopted", []) or []),
        healthy=frozenset(str(c) for c in containers.get("healthy", []) or []),
        created=created,
        pending=pending,
    )


def ensure_install_id(host: str) -> str:
    """The host's install id, created (random, 128 bits) when there is none yet. Call under the host lock. A new
    install records every container it creates from its first on."""
    current = read_ownership(host).install_id
    if current:
        return current
    new = secrets.token_hex(16)
    write_record(host, "install.json", {"install_id": new, "host": host, "created": time.time(), RECORDS_CREATED: True})
    return new


def _update_containers(
    host: str,
    *,
    add: dict[str, Iterable[str]],
    keep: Collection[str] | None,
    pending: Callable[[list[dict[str, str]]], list[dict[str, str]]] | None = None,
    keep_created: Collection[str] | None = None,
) -> None:
    """Read, change and write containers.json. ``keep`` forgets adopted and healthy ids not in it; ``keep_created``
    created ids not in it (a list read after this record was, so that no id recorded meanwhile is lost)."""
    data = read_record(host, "containers.json")
    out: dict[str, Any] = {}
    for key in ("adopted", "healthy", "created"):
        ids = {str(c) for c in data.get(key, []) or []}
        ids |= set(add.get(key, ()))
        limit = keep_created if key == "created" else keep
        if limit is not None:
            ids &= set(limit)  # forget containers that no longer exist, so the files do not grow forever
        out[key] = sorted(ids)
    entries = [p for p in data.get("pending", []) or [] if isinstance(p, dict)]
    out["pending"] = (pending(entries) if pending is not None else entries)[-MAX_PENDING:]
    write_record(host, "containers.json", out)


def record_pending(host: str, name: str, token: str) -> None:
    """Before a create: its container's name and token, so that a create whose answer is lost is still known for
    this install's (the container carries the token as a label; a copy made later cannot take its name)."""
    _update_containers(host, add={}, keep=None, pending=lambda ps: [*ps, {"name": name, "token": token}])


def record_created(host: str, container_id: str, *, token: str) -> None:
    """After a create: the container's id, this install's proof that it made it (docs/design.md, safety rule 9)."""
    _update_containers(
        host, add={"created": [container_id]}, keep=None, pending=lambda ps: [p for p in ps if p.get("token") != token]
    )


def settle_created(host: str, listed: Collection[tuple[str, str, str | None]]) -> list[str]:
    """At a pass's start, under the host lock, with every container the engine lists as (id, name, create-token
    label) read after this record: a lost create's container found by its name and token gets its id recorded, and
    ids of containers that no longer exist are forgotten. Returns the ids recorded."""
    pend = read_ownership(host).pending
    found = [cid for cid, name, token in listed if token is not None and (name, token) in pend]
    tokens = {token for cid, name, token in listed if cid in found}
    _update_containers(
        host,
        add={"created": found},
        keep=None,
        pending=lambda ps: [p for p in ps if p.get("token") not in tokens],
        keep_created=[cid for cid, _, _ in listed],
    )
    return found


def migrate_created(host: str, ids: Collection[str]) -> None:
    """Once, for an install from before the record of created ids (``read_ownership().created`` None), under the
    host lock: record ``ids`` (the containers that carry this install's labels now, which it took for its own until
    now) and mark the install as recording, so that from here on only a recorded id is proof."""
    raw = read_record(host, "install.json")
    _update_containers(host, add={"created": ids}, keep=None)
    write_record(host, "install.json", {**raw, RECORDS_CREATED: True})
    record(host, {"event": "record-created", "ids": sorted(ids), "why": "the install predates the record of ids"})


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
    line = json.dumps(stamped({"time": time.time(), **event}, RECORD_FORMAT), sort_keys=True) + "\n"
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
