"""``reconciler switch NAME`` (and ``POST /v1/switch``, MCP ``host_manage`` action ``switch``, which stand on it):
the manifest's ``topology:`` set to NAME, every other byte of the file kept (``load.topology_edit``), written
atomically with the file's mode and owner, refused when NAME is no topology of the manifest or when the file changed
after it was read. Audited with its caller, as it ended (switched, or refused and why). It changes the desired state
only: the loop (or the next ``apply``) converges it, as it would a hand edit.

Switches are serialised (docs/design.md, safety rule 8), by the frame every edit of the manifest is made in
(``reconciler.service.manifest_edit``): the bytes read are the ones the edit is made from, their ``topology:`` must be
the one the desired state was validated with, and the check that the file still holds exactly those bytes and the
write happen under one lock taken by every edit of the host's manifest, from any front-end and any process. Of two
switches at once one wins; the other finds the bytes changed and is refused, changing nothing, never writing over the
first with a state it did not see.

Called by ``reconciler.service.host_service.HostService.switch``, with its ``CallContext``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.base.fsafe import UnsafePath
from reconciler.base.suggest import did_you_mean
from reconciler.load.topology_edit import TopologyEditError, set_topology, topology_of
from reconciler.service.manifest_edit import edit_manifest
from reconciler.store.loop_state import read_loop_state

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


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


def switch_topology(ctx: CallContext, name: str) -> SwitchResult:
    desired = ctx.desired()  # the files as they are must validate: a switch never writes over a broken root
    host = desired.host.name

    def refused(why: str) -> SwitchRefused:
        ctx.record_refusal("switch", why, host=host)
        return SwitchRefused(f"switch to {name!r} refused: {why}; nothing changed")

    if desired.host.source is not None:
        raise refused(
            f"the manifest comes from the git source {desired.host.source.git} ({desired.host.source.ref}): switch "
            "there, by a commit that sets its topology:"
        )
    if desired.topology is None or desired.manifest_path is None:
        raise refused("the manifest has no named topologies (topologies: and topology:) to switch between")
    if name not in desired.topologies:
        raise refused(
            f"{name!r} is no topology of {desired.manifest_path}: "
            + did_you_mean(name, desired.topologies, what="its topologies")
        )
    manifest = desired.manifest_path
    before = edit_manifest(
        ctx,
        host,
        manifest,
        value_of=topology_of,
        validated=desired.topology,
        wanted=name,
        edit=lambda text: set_topology(text, name),
        errors=(TopologyEditError,),
        refused=refused,
        name="switch",
        done=lambda was: ctx.record(
            host, "switch", outcome="ok", reason=f"topology {was} -> {name}", manifest=manifest
        ),
    )
    return SwitchResult(host, manifest, str(before), name, _loop_running(host))


def _loop_running(host: str) -> bool:
    """Whether a live loop of this host published its state (one whose state cannot be trusted counts as none)."""
    try:
        return read_loop_state(host) is not None
    except UnsafePath:
        return False
