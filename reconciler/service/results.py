"""The typed results of the service's calls: what each call answers, its JSON and its exit code.

Made by ``reconciler.service.host_service.HostService`` and the modules of its calls; read by every front-end. Each
result's ``to_json()`` is exactly what ``--json`` prints, and its ``exit_code`` is the command line's. The
machine-readable error of a failed answer (``error_object``) is built here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reconciler.apply.results import PassResult
    from reconciler.apply.shm_guard import ReclaimResult
    from reconciler.model import DesiredState
    from reconciler.plan.actions import Plan
    from reconciler.plan.fingerprint import Fingerprint
    from reconciler.plan.observed import Observed

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_BLOCKED = 3
EXIT_HELD = 4  # nothing to do now, but a wanted lane waits in backoff (plan, status --check)


def plan_exit_code(p: Plan) -> int:
    """``plan``'s exit code: 1 a source unavailable, 3 blocked, 2 changes pending, 4 held (nothing to do now, but a
    wanted lane waits in backoff, perhaps with a fallback serving its slots), 0 nothing to do: the host as wanted."""
    return _verdict_code(unavailable=bool(p.unavailable), blocked=p.blocked, pending=bool(p.actions), held=bool(p.held))


def _verdict_code(*, unavailable: bool, blocked: bool, pending: bool, held: bool) -> int:
    """The one mapping of a plan's state to the exit codes of ``plan`` and ``status --check``."""
    if unavailable:
        return EXIT_ERROR
    if blocked:
        return EXIT_BLOCKED
    if pending:
        return EXIT_CHANGES
    if held:
        return EXIT_HELD
    return EXIT_OK


@dataclass
class PlanResult:
    desired: DesiredState
    observed: Observed
    plan: Plan
    plan_id: str | None = None
    fingerprint: Fingerprint | None = None
    aliases: list[dict[str, Any]] | None = None  # the manifest's aliases and their verdicts (service.alias_verdicts)

    def to_json(self) -> dict[str, Any]:
        data = self.plan.to_json()
        if self.aliases:
            data["aliases"] = self.aliases
        data["sources"] = {n: v.render() for n, v in self.observed.readings.items()}
        if self.plan_id:
            data["plan_id"] = self.plan_id
        if self.observed.unavailable():
            data["error"] = sources_error(self.observed)
        return data

    @property
    def exit_code(self) -> int:
        return plan_exit_code(self.plan)


def error_object(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The machine-readable error every JSON answer that failed carries under ``error``: a stable ``code``
    (``config_invalid``, ``source_unavailable``, ``approval_required``, ``lock_held``, …) and a ``message`` for
    people, with whatever details fit the code."""
    return {"code": code, "message": message, **extra}


def sources_error(observed: Observed) -> dict[str, Any]:
    down = {s.name: s.detail for s in observed.unavailable()}
    return error_object(
        "source_unavailable", "; ".join(f"{n} source unavailable: {d}" for n, d in down.items()), sources=down
    )


@dataclass
class StatusResult:
    data: dict[str, Any]
    observed: Observed

    def to_json(self) -> dict[str, Any]:
        return self.data

    @property
    def exit_code(self) -> int:
        # Like `shm status`: a source the answer needs was down, so part of it is unknown; or the files are invalid
        # (the answer is then against the last valid desired state, and the error is in it).
        return EXIT_ERROR if self.observed.unavailable() or "error" in self.data else EXIT_OK

    @property
    def check_code(self) -> int:
        """``status --check``: whether the host is as wanted, for a script. 0 as wanted, 2 converging (changes
        pending), 3 blocked, 4 held in backoff, 1 a source unavailable or the files invalid (plain ``status`` exits
        0 for all but the last)."""
        if self.exit_code == EXIT_ERROR:
            return EXIT_ERROR
        p = self.data.get("plan") or {}
        return _verdict_code(
            unavailable=bool(p.get("unavailable")),
            blocked=bool(p.get("blocked")),
            pending=bool(p.get("actions")),
            held=bool(p.get("held")),
        )


@dataclass
class ReclaimOutcome:
    result: ReclaimResult

    def to_json(self) -> dict[str, Any]:
        return self.result.to_json()

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.result.ok else EXIT_ERROR


@dataclass
class ApplyResult:
    """A pass that ran (``passed``), or a plan refused as stale (``changes``) with the plan as it is now."""

    host: str
    passed: PassResult | None = None
    changes: list[str] = field(default_factory=list)
    message: str = ""
    now: Plan | None = None
    observed: Observed | None = None

    def to_json(self) -> dict[str, Any]:
        if self.passed is not None:
            return self.passed.to_json()
        return {
            "host": self.host,
            "result": "stale",
            "message": self.message,
            "changes": self.changes,
            "plan": self.now.to_json() if self.now else None,
        }

    @property
    def exit_code(self) -> int:
        return self.passed.exit_code if self.passed is not None else EXIT_ERROR


@dataclass
class ProbeReport:
    """``reconciler probe RECIPE [--suite S]``: one suite of the recipe's probes against its running lane, with the
    free VRAM of its cards at their lowest meanwhile."""

    host: str
    recipe: str
    containers: list[str]
    results: list[Any]  # reconciler.apply.probes.ProbeResult
    run: Any = None  # reconciler.apply.probes.SuiteRun

    @property
    def ok(self) -> bool:
        """Every probe passed, and the cards kept their reserve under the load unless the policy only reports."""
        return all(r.ok for r in self.results) and not (self.run is not None and self.run.vram.failed)

    def to_json(self) -> dict[str, Any]:
        out = {
            "host": self.host,
            "recipe": self.recipe,
            "containers": self.containers,
            "ok": self.ok,
            "probes": [r.to_json() for r in self.results],
        }
        if self.run is not None:
            out.update(
                suite=self.run.suite,
                planned=self.run.planned,
                passed=sum(r.ok for r in self.results),
                seconds=round(self.run.seconds, 3),
                vram_under_load=self.run.vram.to_json(),
            )
        return out

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_ERROR


@dataclass
class AuditResult:
    host: str
    records: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "records": self.records}

    @property
    def exit_code(self) -> int:
        return EXIT_OK


@dataclass
class PruneResult:
    host: str
    confirmed: bool
    kept_failed: list[dict[str, Any]]
    removed: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "confirmed": self.confirmed,
            "kept_failed": self.kept_failed,
            "removed": self.removed,
            "failed": self.failed,
        }

    @property
    def exit_code(self) -> int:
        return EXIT_ERROR if self.failed else EXIT_OK


@dataclass
class AdoptResult:
    host: str
    adopted: list[dict[str, Any]]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "adopted": self.adopted, "notes": self.notes}

    @property
    def exit_code(self) -> int:
        return EXIT_OK
