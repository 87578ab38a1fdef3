"""One apply under the host's lock: the plan shown, what changed since, and the run of exactly the approved plan.

``ApplySession`` is opened (``open_session``, with the service's ``CallContext``) by
``reconciler.service.host_service.HostService.apply_session`` (the command line's apply, the HTTP API, MCP, a saved
plan's apply) and ``viewed_applier`` by it and the simulation: an applier that plans as
``plan`` does, with a running loop's view (``reconciler.service.loop_view``). Each run leaves an audit record.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from reconciler.apply.applier import Applier
from reconciler.base.errors import ReconcilerError
from reconciler.plan.actions import ActionKind, plan_from_json
from reconciler.plan.fingerprint import (
    FINGERPRINT_VERSION,
    Fingerprint,
    approval_json,
    file_digests,
    fingerprint,
    plan_differences,
)
from reconciler.service.loop_view import loop_view

if TYPE_CHECKING:
    from reconciler.apply.results import PassResult, Progress
    from reconciler.model import DesiredState
    from reconciler.plan.actions import Plan
    from reconciler.service.context import CallContext


class ApplySession:
    """One apply under the host's lock: the plan to show, a way to see whether anything changed since it was
    shown, and ``run()`` to carry out exactly that plan. Made by ``open_session`` (``HostService.apply_session``),
    with the ``CallContext`` of its caller: the root it reloads the files from, and the audit its run is recorded in.

    ``approved`` is the plan the operator saw (shown here, or saved earlier): ``run`` passes it to the applier as the
    contract, and ``refresh``/``changes_since`` compare the plan made now with it, besides the fingerprint."""

    def __init__(self, ctx: CallContext, applier: Applier, files: dict[str, str], view: dict[str, Any]):
        self.ctx = ctx
        self.applier = applier
        self.view = view
        self.observed, self.plan = applier.plan_now()
        self.shown = fingerprint(files, applier.desired, self.observed, view)
        self.approved: Plan = self.plan
        self.started = time.monotonic()
        self.host = applier.desired.host.name  # the host the session holds, its audit records name

    def changes_since(self, before: Fingerprint, approved: dict[str, Any] | None = None) -> list[str]:
        """What changed since ``before`` was taken, and, given the approved plan's JSON, how the plan made now
        differs from it. Taking ``approved`` makes it the plan ``run`` holds to."""
        if before.version != FINGERPRINT_VERSION:
            return [
                f"the plan was saved by {'an earlier' if before.version < FINGERPRINT_VERSION else 'another'} "
                f"version of reconciler (fingerprint {before.version}, {FINGERPRINT_VERSION} now), which did not "
                "record its inputs as this one does; save it again (`reconciler plan --out FILE`)"
            ]
        changes = self.shown.changes_since(before)
        if approved is not None:
            changes += plan_differences(approved, approval_json(self.plan, self.applier.desired))
            try:
                self.approved = plan_from_json(approved)
            except ValueError as exc:
                changes.append(f"the saved plan cannot be read back ({exc}); save it again")
        return changes

    def refresh(self) -> list[str]:
        """Observe and plan again, and load the desired state again (a commit the loop took, a file edited while
        the plan waited: the plan shown was made from the state loaded before); what changed since the plan was
        shown, the plan itself included (then the new plan is the one to show)."""
        files = file_digests(self.ctx.root)
        changes: list[str] = []
        mine = self.applier.desired
        try:
            desired = self.ctx.desired()
        except ReconcilerError as exc:
            desired = mine
            changes.append(f"the desired state no longer loads: {exc}")
        if desired != mine:
            # The plan now is the new files' plan: the one a refusal shows and the one shown next.
            self.applier = _remade(self.applier, desired, self.view)
        self.observed, self.plan = self.applier.plan_now()
        now = fingerprint(files, desired, self.observed, self.view)
        changes += now.changes_since(self.shown)
        changes += plan_differences(approval_json(self.approved, mine), approval_json(self.plan, desired))
        self.shown = now
        if changes:
            self.approved = self.plan  # what is shown next
        return changes

    def run(self, *, source: str = "") -> PassResult:
        result = self.applier.converge(start=(self.observed, self.plan), approved=self.approved)
        self.ctx.record(
            self.host,
            "apply",
            outcome=result.result,
            reason=result.message or _summary(self.plan),
            seconds=time.monotonic() - self.started,
            bytes_freed=sum(o.reclaimed_bytes for o in result.outcomes),
            plan=source,
            actions=[
                {
                    "kind": o.action.kind.value,
                    "recipe": o.action.recipe,
                    "gpus": list(o.action.gpus),
                    "result": o.result,
                    "seconds": round(o.seconds, 3),
                    "detail": o.detail,
                    **o.extra,
                }
                for o in result.outcomes
            ],
        )
        return result


@contextlib.contextmanager
def open_session(
    ctx: CallContext, *, progress: Progress | None = None, cancel: threading.Event | None = None
) -> Iterator[ApplySession]:
    """Hold the host for one apply: observe and plan under the lock, then let the caller show, approve, run.

    The plan is made as ``plan`` makes it: with a running loop's view (the lanes it holds in backoff, the last
    converged topology its fallback serves), so an apply the loop serves (the command line over its socket, the
    HTTP API, MCP) neither enters a held lane nor takes its fallback down."""
    files = file_digests(ctx.root)  # before loading: an edit in between makes the plan look stale, not fresh
    desired = ctx.desired()
    with ctx.exclusive(desired.host.name, "apply"):
        hooks = ctx.hooks
        view = loop_view(desired.host.name)
        applier = viewed_applier(
            desired,
            view,
            progress=progress,
            cancel=cancel,
            on_outcome=hooks.outcome if hooks else None,
            on_reclaim=hooks.reclaim if hooks else None,
            io=ctx.io,
        )
        yield ApplySession(ctx, applier, files, view)


def viewed_applier(desired: DesiredState, view: dict[str, Any], **kwargs: Any) -> Applier:
    """An applier that plans as ``plan`` does: with a running loop's ``view`` (``loop_view``: the lanes it holds, the
    last converged topology its fallback serves, the seconds to each next attempt). ``kwargs`` go to ``Applier``."""
    applier = Applier(desired, hold=view.get("hold"), **kwargs)
    if view:
        last_good, next_attempt = view.get("last_good", ()), view.get("next_attempt", {})
        applier.fallback_view = lambda: (last_good, next_attempt)
    return applier


def _remade(applier: Applier, desired: DesiredState, view: dict[str, Any]) -> Applier:
    """An applier like ``applier`` (its engine, progress, cancel, hooks and seams) for another desired state."""
    return viewed_applier(
        desired,
        view,
        observer=applier.observer,
        progress=applier.progress,
        cancel=applier.cancel,
        on_outcome=applier.on_outcome,
        on_reclaim=applier.on_reclaim,
        connect=False,
        io=applier.io,
    )


def _summary(p: Plan) -> str:
    return (
        "; ".join(
            f"reclaim {len(a.paths)} orphan offload file(s)"
            if a.kind is ActionKind.RECLAIM
            else f"{a.kind.value} {a.key}"
            for a in p.actions
        )
        or "nothing to do"
    )
