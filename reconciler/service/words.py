"""Words that every front-end shows alike: the advice for a plan's blockers, and what an audit record is about.

Read by the command line's text (``reconciler.cli.render``) and the status page (``reconciler.api.page``): one home, so
the two never say a failed action in different words. Each cause's advice is beside the cause itself
(``reconciler.plan.causes.BlockerCause``), and the page reads it there by the cause its plan's JSON names.
"""

from __future__ import annotations

from typing import Any

from reconciler.plan.actions import Plan
from reconciler.plan.causes import BlockerCause


def blocked_advice(plan: Plan) -> list[str]:
    """One line of advice per cause of blocker in the plan, in the causes' order (``BlockerCause``, where each
    cause's advice is): what the operator can do."""
    kept = set(plan.kept_serving)  # our own lanes kept serving: no cause the operator acts on
    causes = {b.cause for b in plan.blockers if b.holder not in kept} or {b.cause for b in plan.blockers}
    return [c.advice for c in BlockerCause if c in causes]


_AUDIT_FAILED = frozenset({"failed", "refused", "error", "interrupted", "stale", "changed", "blocked"})


def audit_what(r: dict[str, Any]) -> str:
    """What an audit record is about, and for a failure its own error (the failed action's ``detail``), not the
    reason it was planned: ``reconciler audit``'s WHAT column and the status page's."""
    target = r.get("target") or r.get("container") or ""
    failed = r.get("outcome") in _AUDIT_FAILED
    text = ""
    if failed:
        bad = [a for a in r.get("actions") or () if isinstance(a, dict) and a.get("result") in _AUDIT_FAILED]
        text = (bad[0].get("detail") if bad else "") or r.get("detail") or r.get("error") or ""
        if bad and not target:
            target = f"{bad[0].get('kind', '?')} {bad[0].get('recipe') or ''}".strip()
    text = text or r.get("reason") or r.get("detail") or ""
    if target and not text.startswith(str(target)):
        return f"{target}: {text}" if text else str(target)
    return str(text)
