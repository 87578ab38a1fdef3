"""``reconciler probe RECIPE [--suite S]``: one suite of a recipe's probes against its running lane, now, with its
cards' free VRAM sampled meanwhile; the run kept as the suite's last (``status``, the metrics) and audited.

Called by ``reconciler.service.host_service.HostService.probe``, with its ``CallContext``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.apply.probes import run_suite
from reconciler.base.errors import ReconcilerError
from reconciler.base.requests import PROBE_SUITES as SUITES
from reconciler.base.suggest import did_you_mean
from reconciler.observe.containers import EngineObserver
from reconciler.plan.observed import LABEL_HOST
from reconciler.service.results import ProbeReport
from reconciler.store.probe_history import record_suite

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def run_probe(ctx: CallContext, recipe: str, *, suite: str = "preflight") -> ProbeReport:
    """Run one suite of a recipe's probes (``preflight``, ``regression`` or ``all``) against its running lane,
    now, sampling its cards' free VRAM meanwhile. Read-only for the host: nothing is started or stopped; the
    run goes to the audit trail and is kept as the suite's last run (``status``, the metrics)."""
    if suite not in SUITES:
        raise ReconcilerError(f"no probe suite {suite!r}: use {', '.join(SUITES[:-1])} or all")
    desired = ctx.desired()
    r = desired.recipes.get(recipe)
    if r is None:
        raise ReconcilerError(
            f"no recipe {recipe!r} in configs/recipes/: " + did_you_mean(recipe, desired.recipes, what="its recipes")
        )
    containers, source = EngineObserver.for_host(desired.host).observe()
    mine = (
        [
            c
            for c in containers
            if c.recipe == recipe and c.active and not c.preserved and c.label(LABEL_HOST) == desired.host.name
        ]
        if source.ok
        else []
    )
    slots = tuple(dict.fromkeys(s for c in mine for s in c.slots if s in desired.host.gpus))
    run = run_suite(desired, recipe, suite, slots=slots)
    report = ProbeReport(desired.host.name, recipe, [c.name for c in mine], run.results, run)
    if run.planned:
        record_suite(desired.host.name, run.to_json())
    failed = run.first_failure
    why = (
        failed.reason()
        if failed
        else run.vram.message()
        if run.vram.failed
        else f"{len(run.results)}/{run.planned} probe(s) of suite {suite} passed"
    )
    ctx.record(
        desired.host.name,
        "probe",
        target=recipe,
        suite=suite,
        outcome="ok" if report.ok else "failed",
        reason=why,
        seconds=round(run.seconds, 3),
        probes=[x.to_json() for x in run.results],
        vram_under_load=run.vram.to_json(),
    )
    return report
