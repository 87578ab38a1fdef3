"""``reconciler adopt NAME``: containers with this host's labels but no install id of their own (made by an earlier
version, or copied) recorded as this install's, under the host's lock, in the install state and the audit trail.

Called by ``reconciler.service.host_service.HostService.adopt``, with its ``CallContext``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.apply.host_io import REAL_IO
from reconciler.base.errors import ReconcilerError
from reconciler.plan.claims import owner_kind
from reconciler.service.results import AdoptResult
from reconciler.store import state

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def adopt_containers(ctx: CallContext, names: list[str]) -> AdoptResult:
    """Record containers that carry this host's labels but no install id as this install's (logged): each named
    by its name or id; nothing is adopted when one of them is not this host's (another install's, or not made by
    this tool)."""
    desired = ctx.desired()
    host = desired.host.name
    with ctx.exclusive(host, "adopt"):
        containers, source = (ctx.io or REAL_IO).engine(desired.host).observe()
        if not source.ok:
            raise ReconcilerError(f"docker source unavailable: {source.detail}; nothing adopted")
        own = state.read_ownership(host)
        picked, notes = [], []
        for want in names:
            found = [c for c in containers if want in (c.name, c.id) or (len(want) >= 12 and c.id.startswith(want))]
            if len(found) != 1:
                raise ReconcilerError(
                    f"{want}: {'no' if not found else 'more than one'} container of that name or id; nothing adopted"
                )
            c = found[0]
            kind = owner_kind(c, host, own)
            if kind == "ours":
                notes.append(f"{c.name} ({c.id[:12]}) is this install's already")
            elif kind == "copied":
                notes.append(
                    f"{c.name} ({c.id[:12]}) carries this install's labels but was not created by it: adopted as "
                    "the operator says it is this host's lane"
                )
                picked.append(c)
            elif kind == "foreign":
                raise ReconcilerError(
                    f"{c.name} ({c.id[:12]}) is not a container this tool made for host {host!r} (it lacks this "
                    "host's labels of its own, or carries another install's id); it cannot be adopted. Nothing adopted"
                )
            else:
                picked.append(c)
        adopted = [{"name": c.name, "id": c.id, "recipe": c.recipe, "slots": list(c.slots)} for c in picked]
        if picked:
            install_id = state.ensure_install_id(host)
            state.adopt(host, [c.id for c in picked], existing=[c.id for c in containers])
            for a in adopted:
                state.record(
                    host,
                    {
                        "event": "adopt",
                        "container": a["name"],
                        "id": a["id"],
                        "install_id": install_id,
                        "recipe": a["recipe"],
                        "slots": a["slots"],
                    },
                )
                ctx.record(host, "adopt", outcome="ok", reason=f"adopted {a['name']}", container=a["name"], id=a["id"])
    return AdoptResult(host, adopted, notes)
