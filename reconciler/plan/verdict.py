"""The host's verdict in one word, with its reason (``decide``): the one answer the status page, ``/healthz``,
``GET /v1/status``, ``reconciler status``, the metrics (``reconciler_drift``, ``reconciler_verdict``) and the fleet's
view give, so no two of them can disagree about the same look at the host.

Pure: it reads ``status --json`` (the files' error, the plan, the sources, and the running loop's published state,
whose ``pass`` names the actions a pass of the loop is taking now), nothing else. Made by the service layer into
every status (``reconciler.service.status``); read again by the front-ends from the status they hold.

docs/design.md, "The verdict".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The words, in the order they win: what cannot be told first, then what stops the host converging, then work.
WORDS: tuple[str, ...] = ("invalid", "unavailable", "blocked", "converging", "held", "converged")


@dataclass(frozen=True)
class Verdict:
    word: str  # one of WORDS
    reason: str  # the same in words, naming what it is about

    def to_json(self) -> dict[str, str]:
        return {"word": self.word, "reason": self.reason}


def acting(status: Mapping[str, Any]) -> list[str]:
    """The actions a pass of the running loop is taking now (``recipe@slots`` of each, by kind), as it published
    them when the pass began; empty between passes, for a pass with nothing to do, or without a loop."""
    loop = status.get("loop")
    now = loop.get("pass") if isinstance(loop, Mapping) else None
    if not isinstance(now, Mapping):
        return []
    return [str(a) for a in now.get("actions") or () if isinstance(a, str)]


def action_label(kind: str, recipe: str | None, gpus: Any, container: str | None = None) -> str:
    """How the loop publishes an action of the pass it runs (``Action.key`` after its kind), and how a view finds
    that action again in the JSON of a plan: ``enter omni@dark-compute-b``, ``reclaim reclaim``, ``prune NAME``."""
    if kind == "reclaim":
        return "reclaim reclaim"
    if kind == "prune":
        return f"prune {container or ''}"
    return f"{kind} {recipe}@{'+'.join(gpus or ())}"


def in_flight(status: Mapping[str, Any], action: Mapping[str, Any]) -> bool:
    """Whether an action of the status's plan is one the running loop's pass is taking now."""
    label = action_label(str(action.get("kind")), action.get("recipe"), action.get("gpus"), action.get("container"))
    return label in acting(status)


def acting_on(status: Mapping[str, Any], recipe: str, gpus: Any) -> str | None:
    """The kind of the action of the status's plan on the lane ``recipe`` on ``gpus`` that the running loop's pass
    is taking now (``in_flight``): enter, wake, sleep or leave; None when none is. The plan made now holds only
    what is still to do, so an action the pass has finished (its lane woken, asleep, gone) is no longer in flight
    here: what a view says of the lane is then what it observes."""
    lane = tuple(gpus or ())
    for a in (status.get("plan") or {}).get("actions") or ():
        if not isinstance(a, Mapping) or a.get("recipe") != recipe or tuple(a.get("gpus") or ()) != lane:
            continue
        if a.get("kind") in ("enter", "wake", "sleep", "leave") and in_flight(status, a):
            return str(a["kind"])
    return None


def _lanes(items: Any) -> str:
    return ", ".join(f"{i.get('recipe')} on {','.join(i.get('gpus') or ())}" for i in items if isinstance(i, Mapping))


def decide(status: Mapping[str, Any]) -> Verdict:
    """The verdict of one status: its files, then its sources, then its plan and the loop's pass in flight."""
    error = status.get("error")
    if isinstance(error, Mapping) and error.get("code") == "config_invalid":
        return Verdict(
            "invalid", "files invalid: the last valid desired state is kept (`reconciler validate` says why)"
        )
    plan = status.get("plan") or {}
    down = list(plan.get("unavailable") or ()) or sorted(
        n for n, v in (status.get("sources") or {}).items() if v != "ok"
    )
    if down:
        return Verdict(
            "unavailable", f"{', '.join(down)} unavailable: whether the host matches its manifests cannot be told"
        )
    blockers = plan.get("blockers") or []
    if plan.get("blocked") or blockers:
        return Verdict("blocked", f"{len(blockers)} blocked: {_lanes(blockers)} (the plan says the fix)")
    now = acting(status)
    if now:
        return Verdict("converging", f"the running loop is acting: {', '.join(now)}")
    actions = plan.get("actions") or []
    if actions:
        what = ", ".join(f"{a.get('kind')} {a.get('recipe') or a.get('container') or ''}".strip() for a in actions)
        return Verdict("converging", f"{len(actions)} action(s) pending: {what}")
    held = plan.get("held") or []
    if held:
        serves = ", a fallback serves meanwhile" if plan.get("fallbacks") else ""
        return Verdict("held", f"{_lanes(held)} held in backoff{serves}")
    return Verdict("converged", "the host matches its manifests")
