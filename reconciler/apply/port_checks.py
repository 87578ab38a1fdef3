"""An enter's checks of its lane's health and probe ports, over the action's context: free before its container
exists, the container's own before anything is asked there.

Who listens is read from /proc (``ctx.io.listeners``, ``reconciler.apply.ports``), never by asking: before the
container exists nothing may listen there; before the health answer and the probes are trusted, every listener must
be a process of the container (a squatter is named, never asked: ``PortSquatted``). Used by
``reconciler.apply.enter``.
"""

from __future__ import annotations

from reconciler.apply.context import ActionContext
from reconciler.apply.errors import PortSquatted
from reconciler.apply.ports import holders_text, lane_ports
from reconciler.model import Recipe
from reconciler.plan.actions import Action


def check_ports_free(ctx: ActionContext, action: Action, recipe: Recipe) -> None:
    """Preflight: nothing listens on the lane's health and probe ports before its container exists; whatever does is
    named (read from /proc, never asked: a squatter must not receive a request)."""
    ports = lane_ports(recipe)
    if not ports:
        return
    view = ctx.io.listeners(ports)
    if view is None:
        return  # /proc/net unreadable here: the HTTP check of the health URL still refuses anything that answers
    for port, held in sorted(view.items()):
        if held:
            raise PortSquatted(
                f"port {port} ({ports[port]}) of recipe {action.recipe} is already bound before "
                f"{action.container} is started: {holders_text(held)}. Its health check and probes could not "
                "tell the new engine from it, so nothing was asked there and nothing was created. Stop what "
                "listens there, or give the recipe another port and health.url"
            )


def port_verdict(ctx: ActionContext, action: Action, cid: str, recipe: Recipe) -> tuple[bool, str]:
    """Whether every listener on the lane's health and probe ports is a process of container ``cid``: (True, "")
    when each port has listeners and all are its own; (False, why) while one is not listening yet or its holder is
    not known. A listener of another process raises PortSquatted, naming it."""
    ports = lane_ports(recipe)
    if not ports or recipe.container.network != "host":
        return True, ""  # off the host's network, the host's sockets are not where its ports are
    view = ctx.io.listeners(ports)
    if view is None:
        return False, "the listening sockets could not be read from /proc/net/tcp"
    for port, held in sorted(view.items()):
        if not held:
            return False, f"nothing listens on port {port} ({ports[port]}) yet"
        for listener, holders in held:
            if not holders:
                return False, (
                    f"port {port} ({ports[port]}) is held by a socket of uid {listener.uid} "
                    f"({listener.where}, inode {listener.inode}) that no readable process holds"
                )
            foreign = [h for h in holders if not h.of(cid)]
            if foreign:
                raise PortSquatted(
                    f"port {port} ({ports[port]}) of {action.container} is held by "
                    f"{holders_text([(listener, foreign)])}, not by a process of the container: another "
                    "process took the lane's port while it started, so its health answer and probes would "
                    "come from that process. Nothing was asked there; stop what listens there, or give the "
                    "recipe another port and health.url"
                )
    return True, ""


def ports_ours(ctx: ActionContext, action: Action, cid: str, recipe: Recipe) -> bool:
    """Whether the lane's ports are the container's own now; while not, why is kept for the wait's timeout."""
    ok, why = port_verdict(ctx, action, cid, recipe)
    if ok:
        ctx.unknown_listeners.pop(cid, None)
    elif why:
        ctx.unknown_listeners[cid] = why
    return ok


def require_ports_ours(ctx: ActionContext, action: Action, cid: str, recipe: Recipe) -> None:
    """Before the probes: the ports are still the container's own (PortSquatted names a holder that is not)."""
    ok, why = port_verdict(ctx, action, cid, recipe)
    if not ok:
        raise PortSquatted(f"{action.container}'s probes were not sent: {why}")
