"""A leave and a prune: the steps that stop and remove containers of ours.

A leave drains its lane (``reconciler.apply.drain``), stops it, removes it (or keeps it for its logs when it exited
badly), reclaims exactly the offload files its plan listed through the guard (safety rule 13 of docs/design.md)
and, where the host file asks, drops clean page cache. A prune removes a failed container kept for its logs once
the plan says it goes. Both are functions over the action's context (``reconciler.apply.context``), run by
``Applier`` (``reconciler.apply.applier``).
"""

from __future__ import annotations

from reconciler.apply import pagecache
from reconciler.apply.context import ActionContext
from reconciler.apply.drain import drain, taking_down
from reconciler.apply.errors import ActionFailed
from reconciler.base.units import human_bytes
from reconciler.host.engine.protocol import NotFound
from reconciler.plan.actions import Action
from reconciler.plan.claims import is_ours, slot_holders
from reconciler.plan.observed import INACTIVE_STATES, NEVER_STARTED_STATES, Observed

CLEAN_EXIT_CODES = (0, 143)  # exited by itself, or on the SIGTERM of `docker stop`
DEFAULT_STOP_TIMEOUT_S = 180.0


def prune(ctx: ActionContext, action: Action, observed: Observed) -> tuple[str, int]:
    """Remove a failed container of ours kept for its logs, once the plan says it goes (its assignment gone, or
    older than the newest ``docker.keep_failed``). Only while it is still stopped: one started meanwhile (by
    hand) is left as it is."""
    cid = action.container_id
    assert cid is not None
    if not any(c.id == cid for c in observed.containers):
        return f"{action.container} already gone", 0
    try:
        status = (ctx.ops.inspect(cid).get("State") or {}).get("Status")
    except NotFound:
        return f"{action.container} already gone", 0
    if status not in INACTIVE_STATES:
        raise ActionFailed(f"{action.container} is {status} now, no longer a stopped kept container: left as it is")
    ctx.ops.remove(cid)
    return f"{action.container} removed (a failed container kept for its logs)", 0


def leave(ctx: ActionContext, action: Action, observed: Observed) -> tuple[str, int]:
    cid = action.container_id
    assert cid is not None
    c = next((x for x in observed.containers if x.id == cid), None)
    if c is None:
        if not observed.docker.ok:
            # Missing from a list the engine did not give whole is not gone: never say so, never skip its stop.
            raise ActionFailed(
                f"{action.container} is not in the engine's list, which did not answer ({observed.docker.detail}): "
                "not taken for gone, left to the next pass"
            )
        return f"{action.container} already gone", 0
    recipe = ctx.desired.recipes.get(c.recipe or "")
    timeout = recipe.stop.timeout_s if recipe else DEFAULT_STOP_TIMEOUT_S
    with taking_down(ctx, action):
        drained = drain(ctx, action, c, recipe, observed)
        if c.active:
            ctx.progress.phase(action, "stopping", timeout=timeout)
            ctx.ops.stop(cid, timeout)
    info = ctx.ops.inspect(cid)
    code = (info.get("State") or {}).get("ExitCode")
    never_started = c.state in NEVER_STARTED_STATES
    if never_started or code in CLEAN_EXIT_CODES:
        ctx.ops.remove(cid)
        fate = "removed"
    else:
        kept = ctx.ops.preserve(cid, c.name)
        ctx.prune_kept(c.name)
        fate = f"exited with code {code}: kept as {kept} for its logs"
    freed = 0
    # Exactly the files its plan listed (safety rule 13): those only its container held, and on the last leave
    # of the running offload containers the orphans they kept; a file it shared with another holder stays.
    paths = list(action.paths)
    if paths:
        ctx.progress.phase(action, "reclaiming its offload files")
        # Those it was the only one seen holding are its own: no running offload container keeps them.
        own = [f.path for f in observed.shm.held_only_by(c.names) if f.path in paths]
        freed = int(ctx.guarded_reclaim(only_paths=paths, claimed=own).reclaimed_bytes)
    # Postcondition: not running, its slots free of every container, none of its listed files left unowned (one
    # that another process took meanwhile is that process's now, and the next plan sees it so).
    after = ctx.observe()
    if any(x.id == cid and x.active for x in after.containers):
        raise ActionFailed(f"{c.name} is still running after stop")
    # Lanes of ours that shared these cards before the leave stay there (sleeping lanes rule 2: one asleep beside
    # an awake one, or the awake one beside a sleeping lane that leaves; its recipe may be gone from the files).
    host = ctx.desired.host.name
    beside = {
        x.id for x in observed.containers if x.id != cid and x.active and is_ours(x, host, observed.ownership)
    } | {x for x, asleep in after.sleeping.items() if asleep}
    held = slot_holders(ctx.desired, after, skip=beside)
    holders = sorted({x.name for slot in c.slots for x in held.get(slot, ())})
    if holders:
        raise ActionFailed(f"slots {','.join(c.slots)} still held by {', '.join(holders)} after leave")
    left = [f for f in after.shm.files if f.path in paths and f.state != "owned"]
    if left:
        raise ActionFailed(
            f"offload file(s) of {c.name} still present after leave: {', '.join(f.path for f in left)} "
            f"({'; '.join(f.reason or f.state for f in left)})"
        )
    detail = f"{drained}; {c.name} {fate}"
    if freed:
        detail += f"; reclaimed {human_bytes(freed)}"
    if ctx.desired.host.page_cache.drop_after_leave:
        # After the leave's postcondition, so nothing of it waits on the drop; pagecache refuses while an
        # enter waits for health.
        ctx.progress.phase(action, "dropping clean page cache")
        drop = pagecache.drop_page_cache()
        ctx.note("page_cache", drop.to_json())
        detail += f"; {drop.describe()}"
    return detail, freed
