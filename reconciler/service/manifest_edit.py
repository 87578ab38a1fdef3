"""One edit of a host's manifest, as ``switch`` (its ``topology:``) and ``promote`` (an alias's recipe) make it: the
bytes read are the ones the edit is made from, the value read must be the one the desired state was validated with,
and the check that the file still holds exactly those bytes and the write happen under one lock (the host I/O's
``edit_lock``, else ``store.lock.manifest_edit_lock``), taken by every edit of the host's manifest from any
front-end and any process (docs/design.md, safety rule 8). Of two edits at once one wins; the other finds the bytes
changed and is refused, changing nothing. The file is written atomically, keeping its mode and owner.

Called by ``reconciler.service.switch`` and ``reconciler.service.promote``, each with its own edit and refusal.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.base.fsafe import read_trusted, write_atomic
from reconciler.store.lock import manifest_edit_lock

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def edit_manifest(
    ctx: CallContext,
    host: str,
    manifest: str,
    *,
    value_of: Callable[[str], str | None],
    validated: str | None,
    wanted: str,
    edit: Callable[[str], str],
    errors: tuple[type[Exception], ...],
    refused: Callable[[str], Exception],
    name: str,
    done: Callable[[str | None], None],
) -> str | None:
    """Set the value ``value_of`` reads in ``manifest`` (relative to the root) to ``wanted`` by ``edit`` (the file's
    text in, the edited text out), and call ``done`` with the value it replaced while the lock is held; the value
    the file held. Nothing is written when it holds ``wanted`` already. Refused (``refused(why)`` raised) when the
    file cannot be read as a manifest (``errors`` of ``value_of`` and ``edit``), holds another value than the
    ``validated`` one, or changed before the write; ``name`` is the command to run again (``switch``)."""
    path = Path(ctx.root) / manifest
    read = read_trusted(path, what="the manifest")
    changed = f"{manifest} changed while the {name} read it: run the {name} again"
    unreadable: tuple[type[Exception], ...] = (*errors, UnicodeDecodeError)
    try:
        text = read.decode("utf-8")
        before = value_of(text)
    except unreadable as exc:
        raise refused(f"{manifest}: {exc}") from None
    if before != validated:
        raise refused(changed)  # another edit (or a hand) wrote after it was validated
    if before == wanted:
        return before
    try:
        edited = edit(text)
    except errors as exc:
        raise refused(f"{manifest}: {exc}") from None
    # The host I/O's lock where the caller handed one in (the simulation's interleaves two edits at it), else the
    # host's own flock: a light command imports no apply layer.
    edit_lock = ctx.io.edit_lock if ctx.io is not None else manifest_edit_lock
    try:
        with edit_lock(host):
            # Under the lock: the file holds exactly the bytes the edit was made from, or another edit came first.
            if read_trusted(path, what="the manifest") != read:
                raise refused(changed)
            st = os.stat(path)
            write_atomic(path, edited, mode=st.st_mode & 0o777)
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                os.chown(path, st.st_uid, st.st_gid)  # the operator's file stays the operator's
            done(before)
    except TimeoutError as exc:
        raise refused(f"{exc}: run the {name} again") from None
    return before
