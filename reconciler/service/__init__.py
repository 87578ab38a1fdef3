"""The service layer: what every front-end can do to a host, as typed calls returning typed results.

The command line (``reconciler.cli*``), the HTTP API (``reconciler.api``) and the MCP server
(``reconciler.mcp_server``) are thin front-ends over this module and never over each other: none of them observes,
plans or acts on its own. Each result's ``to_json()`` is exactly what ``--json`` prints, and its ``exit_code`` is
the command line's. Destructive calls (a confirmed reclaim, an apply) are serialised with the loop (its pass lock
when the loop serves the call in-process, else the host lock file, refused while a loop holds it) and leave a
record in the audit trail (``reconciler.store.audit``) naming the caller.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.plan.fingerprint import (
    FINGERPRINT_VERSION,
    PLAN_FORMAT,
    Fingerprint,
    file_digests,
    fingerprint,
    plan_differences,
    plan_from_json,
)

if TYPE_CHECKING:
    from reconciler.apply.applier import Applier
    from reconciler.apply.results import PassResult, Progress
    from reconciler.apply.shm_results import ReclaimResult
    from reconciler.base.errors import ConfigError
    from reconciler.model import DesiredState, HostConfig
    from reconciler.plan.actions import Plan
    from reconciler.plan.observed import Observed, ShmView

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_BLOCKED = 3

_PLAN_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class Caller:
    """Who asks: the front-end (``cli``, ``api``, ``mcp``, ``loop``) and, over the API, the token's name; on the
    command line the user (``who``: ``root``, or ``root (sudo from alice)``), with ``uid`` and ``sudo_user``."""

    front: str
    who: str = ""
    uid: int | None = None
    sudo_user: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"front": self.front, "who": self.who}
        if self.uid is not None:
            data["uid"] = self.uid
        if self.sudo_user:
            data["sudo_user"] = self.sudo_user
        return data


def user_caller(front: str, *, uid: int, sudo_user: str = "") -> Caller:
    """The caller a command-line user is: the name of ``uid`` (the uid itself where it has none) and, run through
    sudo, whose sudo it was."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    who = f"{name} (sudo from {sudo_user})" if sudo_user else name
    return Caller(front, who, uid=uid, sudo_user=sudo_user)


SINCE_HELP = "give an age (90s, 15m, 2h, 7d), an ISO time (2026-11-30T18:00) or epoch seconds"


def parse_since(text: str | None) -> float | None:
    """The audit query's ``since`` as every front-end takes it: epoch seconds, an ISO time, or an age (90s, 15m, 2h,
    7d). None for no bound; ValueError (with ``SINCE_HELP``) for anything else."""
    from datetime import datetime

    if not text:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(text[:-1]) * units[text[-1]]
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(SINCE_HELP) from None


def plan_exit_code(p: Plan) -> int:
    if p.unavailable:
        return EXIT_ERROR
    if p.blocked:
        return EXIT_BLOCKED
    if p.actions:
        return EXIT_CHANGES
    return EXIT_OK


# ---------------------------------------------------------------- results


@dataclass
class PlanResult:
    desired: DesiredState
    observed: Observed
    plan: Plan
    plan_id: str | None = None
    fingerprint: Fingerprint | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.plan.to_json()
        data["sources"] = {n: v.render() for n, v in self.observed.sources.items()}
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


@dataclass
class ShmStatusResult:
    view: ShmView

    def to_json(self) -> dict[str, Any]:
        from reconciler.observe.shapes import status_json

        return status_json(self.view)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.view.sources_ok else EXIT_ERROR


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


def loop_view(host: str) -> dict[str, Any]:
    """What a running loop holds, as the planner's keyword arguments (``hold``, ``last_good``, ``next_attempt``):
    ``plan`` and ``status`` then show what the loop does meanwhile (a held lane, its fallback). Empty without a
    live loop or with nothing held."""
    from reconciler.store.history import last_topology
    from reconciler.store.loop_state import read_loop_state

    state = read_loop_state(host) or {}
    now = time.time()
    hold: dict[str, str] = {}
    next_attempt: dict[str, float] = {}
    backoff = state.get("backoff")
    for key, e in (backoff if isinstance(backoff, dict) else {}).items():
        try:
            until = float(e["until"])
        except (KeyError, TypeError, ValueError):
            continue
        if until > now:
            hold[key] = (
                f"in backoff after {e.get('failures', '?')} failed enter(s) (the running loop's); next try "
                f"in {until - now:.0f} s (last error: {str(e.get('last_error', ''))[:300]})"
            )
            next_attempt[key] = until - now
    if not hold:
        return {}
    return {"hold": hold, "last_good": last_topology(host), "next_attempt": next_attempt}


@dataclass
class AuditResult:
    host: str
    records: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "records": self.records}

    @property
    def exit_code(self) -> int:
        return EXIT_OK


# ---------------------------------------------------------------- saved plans


def plan_document(p: Plan, fingerprint: Fingerprint, *, plan_id: str | None = None) -> dict[str, Any]:
    """A saved plan: the plan and the fingerprint of what it was made from (redacted: reasons quote commands)."""
    from reconciler.base.redact import redact_data

    doc = {
        "format": PLAN_FORMAT,
        "host": p.host,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint.to_json(),
        "plan": p.to_json(),
    }
    if plan_id:
        doc["plan_id"] = plan_id
    return redact_data(doc)


def write_private(path: str, data: dict[str, Any], *, files: Any = None) -> None:
    """Write a plan as JSON, 0600, through the one safe writer (``reconciler.base.fsafe.write_out``): a planted
    symlink or file at ``path`` is replaced, never followed; a terminal or a pipe (``/dev/stdout``) is written to.
    ``files``: the caller's own (``reconciler.control``), written where the caller lives, else this process's."""
    import json

    from reconciler.base import fsafe

    try:
        if files is not None:
            files.write_json(path, data, indent=2, sort_keys=False)
        else:
            fsafe.write_out(path, json.dumps(data, indent=2, default=str) + "\n", what="the plan file")
    except OSError as exc:
        raise ReconcilerError(f"cannot write the plan to {path}: {exc.strerror or exc}") from None


def read_plan_document(path: str, *, files: Any = None) -> tuple[dict[str, Any], Fingerprint]:
    """A saved plan and its fingerprint; ReconcilerError when the file is not one, or when it is not the running
    user's own (another user could have written or could change what is applied). ``files``: as for
    ``write_private``."""
    from reconciler.base import fsafe

    try:
        data = (files or fsafe).read_json(path, what="the plan file")
    except FileNotFoundError:
        raise ReconcilerError(f"{path}: no such plan file (write one with `reconciler plan --out {path}`)") from None
    except fsafe.UnsafePath as exc:
        raise ReconcilerError(
            f"{exc}; nothing was applied. Write a plan of your own with `reconciler plan --out FILE`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReconcilerError(
            f"{path}: not a saved plan ({exc}); write one with `reconciler plan --out FILE`"
        ) from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise ReconcilerError(f"{path}: not a saved plan of this tool (format {PLAN_FORMAT!r} expected)")
    try:
        return data, Fingerprint.from_json(data.get("fingerprint") or {})
    except ValueError as exc:
        raise ReconcilerError(f"{path}: {exc}") from None


# ---------------------------------------------------------------- an apply in progress


class ApplySession:
    """One apply under the host's lock: the plan to show, a way to see whether anything changed since it was
    shown, and ``run()`` to carry out exactly that plan. Made by ``HostService.apply_session``.

    ``approved`` is the plan the operator saw (shown here, or saved earlier): ``run`` passes it to the applier as the
    contract, and ``refresh``/``changes_since`` compare the plan made now with it, besides the fingerprint."""

    def __init__(self, service: HostService, applier: Applier, files: dict[str, str], view: dict[str, Any]):
        self.service = service
        self.applier = applier
        self.view = view
        self.observed, self.plan = applier.plan_now()
        self.shown = fingerprint(files, applier.desired, self.observed, view)
        self.approved: Plan = self.plan
        self.started = time.monotonic()

    def changes_since(self, before: Fingerprint, approved: dict[str, Any] | None = None) -> list[str]:
        """What changed since ``before`` was taken, and, given the approved plan's JSON, how the plan made now
        differs from it. Taking ``approved`` makes it the plan ``run`` holds to."""
        from reconciler.base.redact import redact_data

        if before.version < FINGERPRINT_VERSION:
            return [
                f"the plan was saved by an earlier version of reconciler (fingerprint {before.version}, "
                f"{FINGERPRINT_VERSION} now), which did not record every input of the plan; save it again"
            ]
        changes = self.shown.changes_since(before)
        if approved is not None:
            changes += plan_differences(approved, redact_data(self.plan.to_json()))
            try:
                self.approved = plan_from_json(approved)
            except ValueError as exc:
                changes.append(f"the saved plan cannot be read back ({exc}); save it again")
        return changes

    def refresh(self) -> list[str]:
        """Observe and plan again; what changed since the plan was shown, the plan itself included (then the new
        plan is the one to show)."""
        from reconciler.base.redact import redact_data

        self.observed, self.plan = self.applier.plan_now()
        now = fingerprint(file_digests(self.service.root), self.applier.desired, self.observed, self.view)
        changes = now.changes_since(self.shown)
        changes += plan_differences(redact_data(self.approved.to_json()), redact_data(self.plan.to_json()))
        self.shown = now
        if changes:
            self.approved = self.plan  # what is shown next
        return changes

    def run(self, *, source: str = "") -> PassResult:
        result = self.applier.converge(start=(self.observed, self.plan), approved=self.approved)
        self.service.record(
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


def viewed_applier(desired: DesiredState, view: dict[str, Any], **kwargs: Any) -> Applier:
    """An applier that plans as ``plan`` does: with a running loop's ``view`` (``loop_view``: the lanes it holds, the
    last converged topology its fallback serves, the seconds to each next attempt). ``kwargs`` go to ``Applier``."""
    from reconciler.apply.applier import Applier

    applier = Applier(desired, hold=view.get("hold"), **kwargs)
    if view:
        last_good, next_attempt = view.get("last_good", ()), view.get("next_attempt", {})
        applier.fallback_view = lambda: (last_good, next_attempt)
    return applier


def _summary(p: Plan) -> str:
    from reconciler.plan.actions import ActionKind

    return (
        "; ".join(
            f"reclaim {len(a.paths)} orphan offload file(s)"
            if a.kind is ActionKind.RECLAIM
            else f"{a.kind.value} {a.key}"
            for a in p.actions
        )
        or "nothing to do"
    )


# ---------------------------------------------------------------- the service


@dataclass(frozen=True)
class ActionHooks:
    """What a running loop counts of the actions its own HTTP API and MCP take in its process, so its metrics
    (actions, bytes reclaimed, refusals) hold every front-end's work, as the audit trail does: ``outcome`` for each
    action of an apply, ``reclaim`` for each guarded reclaim inside one, ``shm_reclaim`` for a confirmed
    ``shm reclaim``."""

    outcome: Callable[[Any], None]
    reclaim: Callable[[Any], None]
    shm_reclaim: Callable[[Any], None]


class HostService:
    """The calls every front-end makes, for the host described under ``root``.

    ``pass_lock``: the running loop's lock around each pass, when the loop itself serves this call (the HTTP API and
    MCP on its listener); destructive calls then wait for the pass to end. Without it (the command line, MCP over
    stdio) they take the host lock file, and are refused while another process, such as a loop, holds it.
    """

    def __init__(
        self,
        root: str,
        *,
        caller: Caller,
        pass_lock: contextlib.AbstractContextManager[object] | None = None,
        hooks: ActionHooks | None = None,
        files: Any = None,
    ):
        self.root = root
        self.caller = caller
        self.pass_lock = pass_lock
        self.hooks = hooks
        # The caller's files (``plan --out FILE``, ``apply FILE``) when the loop serves a command line for it:
        # read and written by that process, where it lives (``reconciler.control.server.ClientFiles``).
        self.files = files

    # ------------------------------------------------------------ helpers

    def desired(self) -> DesiredState:
        from reconciler.load.desired import load_desired

        return load_desired(self.root)

    def host(self) -> HostConfig:
        from reconciler.load.host_file import load_host

        return load_host(self.root)

    @contextlib.contextmanager
    def exclusive(self, host: str, command: str) -> Iterator[None]:
        """Serialised with the loop: its pass lock in-process, or the host lock file."""
        if self.pass_lock is not None:
            with self.pass_lock:
                yield
            return
        from reconciler.store.lock import HostLock, LockDirUnusable, LockHeld

        try:
            lock = HostLock(host, command=command).acquire()
        except (LockHeld, LockDirUnusable) as exc:
            self.record_refusal(command.replace(" ", "-"), str(exc), host=host)
            raise
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Inside ``exclusive``: the loop's pass lock given back for the block (a person deciding on a prompt), so
        the loop's passes go on meanwhile and what they change makes the plan stale; taken again after it. The host
        lock file of a stand-alone command stays held, as before."""
        if self.pass_lock is None:
            yield
            return
        self.pass_lock.__exit__(None, None, None)
        try:
            yield
        finally:
            self.pass_lock.__enter__()

    def record_refusal(self, action: str, reason: str, *, host: str | None = None) -> None:
        """An action this caller asked for and was refused before anything was done (the host lock held, no
        approval, a plan file not its own): in the audit trail with why. An audit that cannot be written does not
        hide the refusal itself."""
        from reconciler.store.audit import audit_log

        try:
            audit_log(host or self._host_name or self.host().name).append(
                {**self.caller.to_json(), "action": action, "outcome": "refused", "reason": reason}
            )
        except ReconcilerError:
            return

    def record(self, action: str, **fields: Any) -> None:
        """One audit record of an action by this caller (for the host under ``root``)."""
        from reconciler.store.audit import audit_log

        host = self._host_name or self.host().name
        audit_log(host).append({**self.caller.to_json(), "action": action, **fields})

    _host_name: str | None = None

    # ------------------------------------------------------------ read-only

    def plan(self, *, save: bool = False, out: str | None = None) -> PlanResult:
        """A dry run. ``save`` keeps it under the state dir and gives it a ``plan_id`` (for ``apply_saved``);
        ``out`` writes it to a file (``reconciler plan --out``). Either way with the fingerprint of its inputs."""
        from reconciler.observe import observe
        from reconciler.plan.enter_checks import enter_needs
        from reconciler.plan.planner import plan

        files = file_digests(self.root)  # before loading: an edit in between makes the saved plan stale
        desired = self.desired()
        self._host_name = desired.host.name
        observed = observe(desired.host, **enter_needs(desired))
        view = loop_view(desired.host.name)
        p = plan(desired, observed, **view)
        fp = fingerprint(files, desired, observed, view)
        result = PlanResult(desired, observed, p, fingerprint=fp)
        if save:
            import uuid  # here: with platform, 3 ms of every command's start, for a saved plan's name

            from reconciler.store.state import checked_subdir

            plan_id = uuid.uuid4().hex
            d = checked_subdir(desired.host.name, "plans", create=True)
            _prune_plans(d)
            write_private(str(d / f"{plan_id}.json"), plan_document(p, fp, plan_id=plan_id))
            result.plan_id = plan_id
        if out:
            write_private(out, plan_document(p, fp), files=self.files)
        return result

    def status(self) -> StatusResult:
        from reconciler.base.errors import ConfigError
        from reconciler.observe import observe
        from reconciler.plan.enter_checks import enter_needs
        from reconciler.plan.planner import plan
        from reconciler.service.render import status_data

        try:
            desired = self.desired()
        except ConfigError as exc:
            return self._status_of_invalid_files(exc)
        observed = observe(desired.host, **enter_needs(desired))
        data = status_data(desired, observed, plan(desired, observed, **loop_view(desired.host.name)))
        from reconciler.store.probe_history import last_suites

        data["probe_suites"] = last_suites(desired.host.name, set(desired.recipes))
        if observed.unavailable():
            data["error"] = sources_error(observed)
        return StatusResult(data, observed)

    def _status_of_invalid_files(self, exc: ConfigError) -> StatusResult:
        """``status`` while the files do not validate: what the host runs, measured against the last valid desired
        state (the running loop's, which it keeps acting on; else the last converged topology), with the files'
        error in the answer (exit 1). Without a valid host file there is nothing to observe by: the error alone."""
        from pathlib import Path

        from reconciler.base.errors import ConfigError
        from reconciler.load.desired import _secret_digests
        from reconciler.load.host_file import load_host
        from reconciler.load.recipes import load_recipes
        from reconciler.model import DesiredAssignment, DesiredState
        from reconciler.observe import observe
        from reconciler.plan.planner import plan
        from reconciler.service.render import status_data
        from reconciler.store.history import last_topology
        from reconciler.store.loop_state import read_loop_state

        try:
            host = load_host(self.root)
        except ConfigError:
            raise exc from None
        try:
            recipes = load_recipes(Path(self.root))
        except ConfigError:
            recipes = {}
        kept = (read_loop_state(host.name) or {}).get("desired")
        if isinstance(kept, dict):
            source, manifest = "the running loop's last valid desired state", kept.get("manifest")
            pairs = [
                (a.get("recipe"), tuple(a.get("gpus") or ()))
                for a in kept.get("assignments") or ()
                if isinstance(a, dict)
            ]
        else:
            source, manifest = "the last converged topology (no loop is running)", None
            pairs = list(last_topology(host.name))
        assignments = tuple(
            DesiredAssignment(r, slots, recipes[r].content_hash(), recipes[r].offload.capacity_bytes)
            for r, slots in pairs
            if isinstance(r, str) and r in recipes and slots and all(s in host.gpus for s in slots)
        )
        desired = DesiredState(
            host=host,
            recipes=recipes,
            assignments=assignments,
            manifest_path=manifest,
            secret_digests=_secret_digests(Path(self.root), host, recipes, []),
        )
        observed = observe(host)
        data = status_data(desired, observed, plan(desired, observed, **loop_view(host.name)))
        data["desired_from"] = source if pairs else "none: no loop is running and no topology ever converged"
        data["error"] = error_object(
            "config_invalid",
            "the files do not validate; fix them (`reconciler validate` says the same)",
            problems=[{"path": p.path, "line": p.line, "message": p.message} for p in exc.problems],
        )
        return StatusResult(data, observed)

    def probe(self, recipe: str, *, suite: str = "preflight") -> ProbeReport:
        """Run one suite of a recipe's probes (``preflight``, ``regression`` or ``all``) against its running lane,
        now, sampling its cards' free VRAM meanwhile. Read-only for the host: nothing is started or stopped; the
        run goes to the audit trail and is kept as the suite's last run (``status``, the metrics)."""
        from reconciler.apply.probes import run_suite
        from reconciler.model import PROBE_SUITES
        from reconciler.observe.docker_obs import DockerObserver
        from reconciler.store.probe_history import record_suite

        if suite not in (*PROBE_SUITES, "all"):
            raise ReconcilerError(f"no probe suite {suite!r}: use {', '.join(PROBE_SUITES)} or all")
        desired = self.desired()
        r = desired.recipes.get(recipe)
        if r is None:
            raise ReconcilerError(
                f"no recipe {recipe!r} in configs/recipes/ (known: {', '.join(sorted(desired.recipes))})"
            )
        containers, source = DockerObserver.for_host(desired.host).observe()
        from reconciler.plan.observed import LABEL_HOST

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
        self.record(
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

    def shm_status(self) -> ShmStatusResult:
        from reconciler.observe.docker_obs import DockerObserver
        from reconciler.observe.shm import inspect_shm
        from reconciler.store.state import read_ownership

        host = self.host()
        containers, docker = DockerObserver.for_host(host).observe()
        settled = read_ownership(host.name).healthy
        return ShmStatusResult(inspect_shm(host.shm, containers=containers, docker=docker, settled=settled))

    def audit(self, *, since: float | None = None) -> AuditResult:
        from reconciler.store.audit import audit_log

        host = self.host().name
        return AuditResult(host, audit_log(host).read(since=since))

    # ------------------------------------------------------------ destructive

    def shm_reclaim(self, *, confirm: bool, paths: list[str] | None = None) -> ReclaimOutcome:
        """The guarded cleanup: a dry run unless ``confirm``; with ``paths``, nothing outside them is removed."""
        from reconciler.apply.shm_guard import reclaim
        from reconciler.observe.docker_obs import DockerObserver
        from reconciler.store.state import read_ownership

        host = self.host()
        self._host_name = host.name
        observer = DockerObserver.for_host(host)
        settled = lambda: read_ownership(host.name).healthy  # noqa: E731 - read afresh for each inspection
        if not confirm:
            return ReclaimOutcome(
                reclaim(host.shm, observe_docker=observer.observe, confirm=False, only_paths=paths, settled=settled)
            )
        t0 = time.monotonic()
        with self.exclusive(host.name, "shm reclaim"):
            result = reclaim(host.shm, observe_docker=observer.observe, confirm=True, only_paths=paths, settled=settled)
        if self.hooks:
            self.hooks.shm_reclaim(result)
        self.record(
            "shm-reclaim",
            outcome="refused" if result.refused else ("ok" if result.ok else "failed"),
            reason=result.refused or f"{len(result.reclaimed)} orphan offload file(s)",
            bytes_freed=int(result.reclaimed_bytes),
            paths=[r.path for r in result.reclaimed],
            seconds=round(time.monotonic() - t0, 3),
        )
        return ReclaimOutcome(result)

    @contextlib.contextmanager
    def apply_session(
        self, *, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> Iterator[ApplySession]:
        """Hold the host for one apply: observe and plan under the lock, then let the caller show, approve, run.

        The plan is made as ``plan`` makes it: with a running loop's view (the lanes it holds in backoff, the last
        converged topology its fallback serves), so an apply the loop serves (the command line over its socket, the
        HTTP API, MCP) neither enters a held lane nor takes its fallback down."""
        files = file_digests(self.root)  # before loading: an edit in between makes the plan look stale, not fresh
        desired = self.desired()
        self._host_name = desired.host.name
        with self.exclusive(desired.host.name, "apply"):
            hooks = self.hooks
            view = loop_view(desired.host.name)
            applier = viewed_applier(
                desired,
                view,
                progress=progress,
                cancel=cancel,
                on_outcome=hooks.outcome if hooks else None,
                on_reclaim=hooks.reclaim if hooks else None,
            )
            yield ApplySession(self, applier, files, view)

    def adopt(self, names: list[str]) -> AdoptResult:
        """Record containers that carry this host's labels but no install id as this install's (logged)."""
        return _adopt(self, names)

    def prune(self, *, confirm: bool) -> PruneResult:
        """The failed containers of this install kept for their logs: listed (a dry run), or with ``confirm``
        removed, all of them at once, each only while it is still stopped (logged in the audit trail)."""
        return _prune(self, confirm=confirm)

    def saved_plan(self, source: str) -> tuple[str, dict[str, Any], Fingerprint]:
        """A saved plan by its ``plan_id`` (from ``plan(save=True)``) or by file path."""
        if _PLAN_ID.match(source):
            from reconciler.store.state import checked_subdir, host_dir

            host = self.host().name
            try:
                path = str(checked_subdir(host, "plans", create=False) / f"{source}.json")
            except FileNotFoundError:
                path = str(host_dir(host) / "plans" / f"{source}.json")
            if not os.path.lexists(path):
                raise ReconcilerError(f"no saved plan {source} on this host (plans are kept for a day; make a new one)")
            doc, fp = read_plan_document(path)  # the host's own store, not the caller's file
        else:
            path = source
            doc, fp = read_plan_document(path, files=self.files)
        return path, doc, fp

    def apply_saved(
        self, source: str, *, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> ApplyResult:
        """Apply exactly a saved plan, refused (``stale``, with what changed) when anything changed since."""
        try:
            path, doc, fp = self.saved_plan(source)
        except ReconcilerError as exc:
            self.record_refusal("apply", str(exc))
            raise
        host = self.host().name
        if doc.get("host") != host:
            raise ReconcilerError(f"{path}: a plan for host {doc.get('host')!r}, but {self.root} is host {host!r}")
        with self.apply_session(progress=progress, cancel=cancel) as s:
            # The saved plan is the contract: rebuilt, compared with the plan made now, and the one the pass holds to.
            saved = doc.get("plan")
            changes = s.changes_since(fp, saved if isinstance(saved, dict) else {"host": host, "actions": None})
            if changes:
                message = f"the saved plan {source} is stale"
                self.record("apply", outcome="stale", reason=message, plan=source, changes=changes[:40])
                return ApplyResult(host, changes=changes, message=message, now=s.plan, observed=s.observed)
            return ApplyResult(host, passed=s.run(source=source))


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


def _prune(service: HostService, *, confirm: bool) -> PruneResult:
    from reconciler.apply.docker_ops import DockerOps
    from reconciler.observe.docker_obs import DockerObserver
    from reconciler.plan.observed import INACTIVE_STATES
    from reconciler.plan.planner import kept_failed
    from reconciler.store import state

    desired = service.desired()
    host = desired.host.name
    service._host_name = host
    observer = DockerObserver.for_host(desired.host)

    def look() -> list[Any]:
        containers, source = observer.observe()
        if not source.ok:
            raise ReconcilerError(f"docker source unavailable: {source.detail}; nothing pruned")
        return kept_failed(host, containers, state.read_ownership(host))

    def describe(c: Any) -> dict[str, Any]:
        return {
            "name": c.name,
            "id": c.id,
            "recipe": c.recipe,
            "gpus": list(c.slots),
            "state": c.state,
            "exit_code": c.exit_code,
        }

    if not confirm:
        return PruneResult(host, False, [describe(c) for c in look()])
    with service.exclusive(host, "prune"):
        found = look()
        ops = DockerOps(connect=lambda: observer.api, url=observer.url, ping=observer.ping)
        res = PruneResult(host, True, [describe(c) for c in found])
        for c in found:
            try:
                status = (ops.inspect(c.id).get("State") or {}).get("Status")
                if status not in INACTIVE_STATES:
                    res.failed.append({"name": c.name, "reason": f"it is {status} now: left as it is"})
                    continue
                ops.remove(c.id)
            except Exception as exc:  # noqa: BLE001 - say which one could not be removed, and go on
                res.failed.append({"name": c.name, "reason": f"{type(exc).__name__}: {exc}"})
                continue
            res.removed.append(c.name)
            service.record("prune", outcome="ok", reason=f"removed kept failed container {c.name}", container=c.name)
        return res


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


def _adopt(service: HostService, names: list[str]) -> AdoptResult:
    from reconciler.observe.docker_obs import DockerObserver
    from reconciler.plan.claims import owner_kind
    from reconciler.store import state

    desired = service.desired()
    host = desired.host.name
    service._host_name = host
    with service.exclusive(host, "adopt"):
        containers, source = DockerObserver.for_host(desired.host).observe()
        if not source.ok:
            raise ReconcilerError(f"docker source unavailable: {source.detail}; nothing adopted")
        own = state.read_ownership(host)
        picked, notes = [], []
        for want in names:
            found = [c for c in containers if want in (c.name, c.id) or (len(want) >= 12 and c.id.startswith(want))]
            if len(found) != 1:
                raise ReconcilerError(
                    f"{want}: {'no' if not found else 'more than one'} container of that name or id; nothing adopted"
                )
            c = found[0]
            kind = owner_kind(c, host, own)
            if kind == "ours":
                notes.append(f"{c.name} ({c.id[:12]}) is this install's already")
            elif kind == "copied":
                notes.append(
                    f"{c.name} ({c.id[:12]}) carries this install's labels but was not created by it: adopted as "
                    "the operator says it is this host's lane"
                )
                picked.append(c)
            elif kind == "foreign":
                raise ReconcilerError(
                    f"{c.name} ({c.id[:12]}) is not a container this tool made for host {host!r} (it lacks this "
                    "host's labels of its own, or carries another install's id); it cannot be adopted. Nothing adopted"
                )
            else:
                picked.append(c)
        adopted = [{"name": c.name, "id": c.id, "recipe": c.recipe, "slots": list(c.slots)} for c in picked]
        if picked:
            install_id = state.ensure_install_id(host)
            state.adopt(host, [c.id for c in picked], existing=[c.id for c in containers])
            for a in adopted:
                state.record(
                    host,
                    {
                        "event": "adopt",
                        "container": a["name"],
                        "id": a["id"],
                        "install_id": install_id,
                        "recipe": a["recipe"],
                        "slots": a["slots"],
                    },
                )
                service.record("adopt", outcome="ok", reason=f"adopted {a['name']}", container=a["name"], id=a["id"])
    return AdoptResult(host, adopted, notes)


def _prune_plans(d: Any, *, max_age_s: float = 86400) -> None:
    """Saved plans older than a day go: a plan that old is stale anyway."""
    cutoff = time.time() - max_age_s
    for p in d.glob("*.json"):
        with contextlib.suppress(OSError):
            if p.stat().st_mtime < cutoff:
                p.unlink()
