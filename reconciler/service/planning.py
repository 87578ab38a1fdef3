"""``reconciler plan``: observe, plan as a running loop would (its view), take the fingerprint of the inputs, and
keep the plan (``save``: under the host's store, by ``plan_id``) or write it (``out``: ``plan --out FILE``).

Called by ``reconciler.service.host_service.HostService.plan``, with its ``CallContext``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.apply.host_io import REAL_IO
from reconciler.plan.enter_checks import enter_needs
from reconciler.plan.fingerprint import file_digests, fingerprint
from reconciler.plan.planner import plan
from reconciler.service.alias_verdicts import alias_verdicts
from reconciler.service.loop_view import loop_view
from reconciler.service.results import PlanResult
from reconciler.service.saved_plans import plan_document, save_plan, write_private

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def plan_host(ctx: CallContext, *, save: bool = False, out: str | None = None) -> PlanResult:
    """A dry run. ``save`` keeps it under the state dir and gives it a ``plan_id`` (for ``apply_saved``);
    ``out`` writes it to a file (``reconciler plan --out``). Either way with the fingerprint of its inputs."""
    files = file_digests(ctx.root)  # before loading: an edit in between makes the saved plan stale
    desired = ctx.desired()
    view = loop_view(desired.host.name)
    observed = (ctx.io or REAL_IO).observe(desired.host, **enter_needs(desired, view.get("last_good", ())))
    p = plan(desired, observed, **view)
    fp = fingerprint(files, desired, observed, view)
    result = PlanResult(desired, observed, p, fingerprint=fp, aliases=alias_verdicts(desired))
    if save:
        result.plan_id = save_plan(desired.host.name, p, fp, desired)
    if out:
        write_private(out, plan_document(p, fp, desired), files=ctx.files)
    return result
