"""What an action and a pass report: ``Outcome`` (one action), ``PassResult`` (one converge pass, with its
exit code and JSON), and the ``Progress`` a caller is told along the way.

Made by ``reconciler.apply.applier``; read by the command line, the service, the loop and its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from reconciler.plan.actions import Action, Plan

# The vocabularies of a result, with their JSON strings (a contract: `apply --json`'s "result", the audit trail):
# one action's, and one pass's. "changed": the host changed after the plan was shown and its next step was not in it.
# "superseded": an enter abandoned while it waited for health, its lane no longer wanted after an edit (the loop's).
OutcomeResult = Literal["ok", "failed", "refused", "interrupted", "superseded"]
PassVerdict = Literal["converged", "blocked", "failed", "error", "held", "interrupted", "changed", "superseded"]
OUTCOME_RESULTS: tuple[str, ...] = get_args(OutcomeResult)
PASS_VERDICTS: tuple[str, ...] = get_args(PassVerdict)


class Progress(Protocol):
    def phase(self, action: Action, phase: str, *, elapsed: float = 0.0, timeout: float | None = None) -> None: ...

    def done(self, action: Action, result: str, seconds: float, detail: str) -> None: ...


class NoProgress:
    def phase(self, action: Action, phase: str, *, elapsed: float = 0.0, timeout: float | None = None) -> None:
        return None

    def done(self, action: Action, result: str, seconds: float, detail: str) -> None:
        return None


@dataclass(frozen=True)
class Outcome:
    action: Action
    result: OutcomeResult
    seconds: float
    detail: str = ""
    reclaimed_bytes: int = 0
    refusal: str = ""  # for "refused": why, as a key of the metrics' refusal reasons
    # Figures an action measured: an enter's "gpu_reserve" (free VRAM per slot once settled), a leave's
    # "page_cache" (Cached before and after the drop).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.action.to_json(),
            "result": self.result,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "reclaimed_bytes": self.reclaimed_bytes,
            **self.extra,
        }


@dataclass
class PassResult:
    result: PassVerdict
    plan: Plan
    final: Plan
    outcomes: list[Outcome] = field(default_factory=list)
    message: str = ""
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return {"converged": 0, "held": 0, "blocked": 3}.get(self.result, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.plan.host,
            "result": self.result,
            "message": self.message,
            "seconds": round(self.seconds, 3),
            "plan": self.plan.to_json(),
            "actions": [o.to_json() for o in self.outcomes],
            "final": self.final.to_json(),
        }
