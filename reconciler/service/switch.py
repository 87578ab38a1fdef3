"""``reconciler switch NAME`` (and ``POST /v1/switch``, MCP ``host_manage`` action ``switch`` once they stand on it):
the manifest's ``topology:`` set to NAME, every other byte of the file kept (``load.topology_edit``), written
atomically with the file's mode and owner, refused when NAME is no topology of the manifest or when the file changed
after it was read. Audited with its caller. It changes the desired state only: the loop (or the next ``apply``)
converges it, as it would a hand edit.

Called by ``reconciler.service.host_service.HostService.switch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.base.fsafe import read_trusted, write_atomic
from reconciler.load.topology_edit import TopologyEditError, set_topology

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
            f"{name!r} is no topology of {desired.manifest_path}: known {sorted(desired.topologies)}",
        )
    path = Path(service.root) / desired.manifest_path
    read = read_trusted(path, what="the manifest")
    if name == desired.topology:
        return SwitchResult(host, desired.manifest_path, name, name)
    try:
        edited = set_topology(read.decode("utf-8"), name)
    except (TopologyEditError, UnicodeDecodeError) as exc:
        raise _refused(service, host, name, f"{desired.manifest_path}: {exc}") from None
    st = os.stat(path)
    if read_trusted(path, what="the manifest") != read:
        raise _refused(
            service, host, name, f"{desired.manifest_path} changed while the switch read it: run the switch again"
        )
    write_atomic(path, edited, mode=st.st_mode & 0o777)
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
        os.chown(path, st.st_uid, st.st_gid)  # the operator's file stays the operator's
    service.record(
        "switch", outcome="ok", reason=f"topology {desired.topology} -> {name}", manifest=desired.manifest_path
    )
    return SwitchResult(host, desired.manifest_path, desired.topology, name)


def _refused(service: HostService, host: str, name: str, why: str) -> SwitchRefused:
    service.record_refusal("switch", why, host=host)
    return SwitchRefused(f"switch to {name!r} refused: {why}; nothing changed")
