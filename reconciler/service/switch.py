"""``reconciler switch NAME`` (and ``POST /v1/switch``, MCP ``host_manage`` action ``switch``, which stand on it):
the manifest's ``topology:`` set to NAME, every other byte of the file kept (``load.topology_edit``), written
atomically with the file's mode and owner, refused when NAME is no topology of the manifest or when the file changed
after it was read. Audited with its caller, as it ended (switched, or refused and why). It changes the desired state
only: the loop (or the next ``apply``) converges it, as it would a hand edit.

Switches are serialised (docs/design.md, safety rule 8): the bytes read are the ones the edit is made from, their
``topology:`` must be the one the desired state was validated with, and the check that the file still holds exactly
those bytes and the write happen under one lock (``store.lock.manifest_edit_lock``, the host I/O's ``edit_lock``)
taken by every switch of the host, from any front-end and any process. Of two switches at once one wins; the other finds the bytes changed and is
refused, changing nothing, never writing over the first with a state it did not see.

Called by ``reconciler.service.host_service.HostService.switch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.base.fsafe import UnsafePath, read_trusted, write_atomic
from reconciler.base.suggest import did_you_mean
from reconciler.load.topology_edit import TopologyEditError, set_topology, topology_of
from reconciler.store.lock import manifest_edit_lock
from reconciler.store.loop_state import read_loop_state

if TYPE_CHECKING:
    from reconciler.service.host_service import HostService


class SwitchRefused(ReconcilerError):
    """The switch was refused before the manifest was written: nothing changed."""

    code = "switch_refused"


@dataclass(frozen=True)
class SwitchResult:
    host: str
    manifest: str
    before: str
    after: str
    # Whether a loop (`reconciler run`) runs for the host and so converges the edit; without one nothing does until
    # an apply (or a switch with --wait).
    loop_running: bool = True

    @property
    def changed(self) -> bool:
        return self.before != self.after

    @property
    def exit_code(self) -> int:
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "manifest": self.manifest,
            "from": self.before,
            "topology": self.after,
            "changed": self.changed,
            "loop_running": self.loop_running,
        }


def switch_topology(service: HostService, name: str) -> SwitchResult:
    desired = service.desired()  # the files as they are must validate: a switch never writes over a broken root
    host = desired.host.name
    if desired.host.source is not None:
        raise _refused(
            service,
            host,
            name,
            f"the manifest comes from the git source {desired.host.source.git} ({desired.host.source.ref}): switch "
            "there, by a commit that sets its topology:",
        )
    if desired.topology is None or desired.manifest_path is None:
        raise _refused(
            service, host, name, "the manifest has no named topologies (topologies: and topology:) to switch between"
        )
    if name not in desired.topologies:
        raise _refused(
            service,
            host,
            name,
            f"{name!r} is no topology of {desired.manifest_path}: "
            + did_you_mean(name, desired.topologies, what="its topologies"),
        )
    path = Path(service.root) / desired.manifest_path
    read = read_trusted(path, what="the manifest")
    changed = f"{desired.manifest_path} changed while the switch read it: run the switch again"
    try:
        text = read.decode("utf-8")
        before = topology_of(text)
    except (TopologyEditError, UnicodeDecodeError) as exc:
        raise _refused(service, host, name, f"{desired.manifest_path}: {exc}") from None
    if before != desired.topology:
        raise _refused(service, host, name, changed)  # another switch (or a hand) wrote after it was validated
    running = _loop_running(host)
    if name == before:
        return SwitchResult(host, desired.manifest_path, name, name, running)
    try:
        edited = set_topology(text, name)
    except TopologyEditError as exc:
        raise _refused(service, host, name, f"{desired.manifest_path}: {exc}") from None
    # The host I/O's lock where the caller handed one in (the simulation's interleaves two switches at it), else the
    # host's own flock: a light command imports no apply layer.
    edit_lock = service.io.edit_lock if service.io is not None else manifest_edit_lock
    try:
        with edit_lock(host):
            # Under the lock: the file holds exactly the bytes the edit was made from, or another edit came first.
            if read_trusted(path, what="the manifest") != read:
                raise _refused(service, host, name, changed)
            st = os.stat(path)
            write_atomic(path, edited, mode=st.st_mode & 0o777)
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                os.chown(path, st.st_uid, st.st_gid)  # the operator's file stays the operator's
            service.record(
                "switch", outcome="ok", reason=f"topology {before} -> {name}", manifest=desired.manifest_path
            )
    except TimeoutError as exc:
        raise _refused(service, host, name, f"{exc}: run the switch again") from None
    return SwitchResult(host, desired.manifest_path, before, name, running)


def _loop_running(host: str) -> bool:
    """Whether a live loop of this host published its state (one whose state cannot be trusted counts as none)."""
    try:
        return read_loop_state(host) is not None
    except UnsafePath:
        return False


def _refused(service: HostService, host: str, name: str, why: str) -> SwitchRefused:
    service.record_refusal("switch", why, host=host)
    return SwitchRefused(f"switch to {name!r} refused: {why}; nothing changed")
