"""Words that every front-end shows alike: the fix for each cause of a blocker, and what an audit record is about.

Read by the command line's text (``reconciler.cli.render``) and the status page (``reconciler.api.page``): one home, so
the two never say a blocker's fix or a failed action in different words.
"""

from __future__ import annotations

from typing import Any

from reconciler.plan.actions import Plan

_ADVICE = {
    "held": "The reconciler never stops what it does not own: free the slot or change the manifest.",
    "tmpfs": "Make room on the offload tmpfs (`reconciler shm status` shows what holds it) or pick a smaller "
    "offload lane.",
    "memory": "A card reports VRAM in use but NVML lists no process for it (on WSL2: Windows programs, or "
    "processes of another pid namespace): close what holds it, or raise gpu_reserve.idle_used_gib (or the slot's "
    "idle_used_gib) in configs/host.yaml if that is the card's idle use.",
    "adopt": "A container with this host's labels but without this install's id is never stopped unasked: "
    "adopt it (`reconciler adopt NAME`, logged) if it is this host's lane, or remove it.",
    "image": "The tool never pulls: pull or build the image on this host (docker pull IMAGE), or name one it has; "
    "the lane it would replace keeps serving meanwhile.",
    "runtime": "GPUs by DeviceRequest need NVIDIA's container toolkit on the engine's host; on a host without NVIDIA "
    "GPUs set docker.gpu_requests: false in configs/host.yaml.",
    "port": "Another process or lane listens on the recipe's port: stop it, or give the recipe a port of its own "
    "(its command and health.url); the lane it would replace keeps serving meanwhile.",
    "recipe": "The recipe contradicts itself: make its command agree with its keys.",
    "source": "A source could not vouch for the slots or the offload files, so nothing that needs it is changed: "
    "fix the source named above.",
}


def blocker_fix(cause: str) -> str:
    """What the operator can do about a blocker of this cause (``Blocker.cause``): the fix, never the cause again."""
    return _ADVICE.get(cause, "Run `reconciler plan` for what stands in the way.")


def blocked_advice(plan: Plan) -> list[str]:
    """One line of advice per kind of blocker in the plan, in a fixed order: what the operator can do."""
    kept = set(plan.kept_serving)  # our own lanes kept serving: no cause the operator acts on
    causes = {b.cause for b in plan.blockers if b.holder not in kept} or {b.cause for b in plan.blockers}
    order = ("source", "adopt", "held", "memory", "tmpfs", "image", "runtime", "port", "recipe")
    return [_ADVICE[c] for c in order if c in causes]


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
