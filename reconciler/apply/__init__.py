"""The apply layer: the only part of the tool that changes the host.

``Applier.converge()`` runs one converge pass: observe, plan, execute the first action, observe again and re-plan,
until the plan is empty, blocked, or an action failed. Each action has a preflight, the act, and a postcondition;
an action is done when the new plan has nothing left for it. Called by ``reconciler apply`` and the loop.

Safety (docs/design.md, safety rules 6 and 7): an enter needs its slots free and tmpfs room (orphans are reclaimed through the one
shm guard first); a failed enter keeps its stopped container for the logs, reclaims its unmapped offload file and
frees the GPUs. Everything this layer creates carries the ownership labels from the create call on, so an
interrupted pass never leaves an unowned container behind.
"""

from __future__ import annotations

import functools
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlsplit

from reconciler.apply import pagecache
from reconciler.apply.docker_ops import DockerOps, create_spec
from reconciler.base import direct_http
from reconciler.base.errors import ReconcilerError
from reconciler.base.units import human_bytes
from reconciler.load.secrets import SecretError
from reconciler.load.secrets import resolve as resolve_secrets
from reconciler.model import DesiredState, Recipe
from reconciler.observe import observe, procfs
from reconciler.observe.docker_obs import DockerObserver
from reconciler.observe.gpu import slots_of_container, unattributable_slots
from reconciler.observe.net import TcpListener, read_comm, read_tcp_listeners, socket_holders
from reconciler.plan.actions import Action, ActionKind, Plan
from reconciler.plan.claims import owner_kind, slot_holders
from reconciler.plan.enter_checks import enter_needs
from reconciler.plan.observed import ENDED_STATES, INACTIVE_STATES, LABEL_CREATE_TOKEN, NEVER_STARTED_STATES, Observed
from reconciler.plan.planner import plan
from reconciler.plan.vram import ReserveVerdict, enter_reserve_verdict
from reconciler.store.state import (
    ensure_install_id,
    mark_healthy,
    migrate_created,
    read_ownership,
    record_created,
    record_pending,
    settle_created,
)

CLEAN_EXIT_CODES = (0, 143)  # exited by itself, or on the SIGTERM of `docker stop`
DEFAULT_STOP_TIMEOUT_S = 180.0


class ActionFailed(ReconcilerError):
    """An action did not reach its postcondition. ``cause`` is what the operator should read first."""

    def __init__(self, cause: str, *, detail: str = ""):
        self.cause = cause
        self.detail = detail
        super().__init__(cause)


class BelowReserve(ActionFailed):
    """A lane healthy and settled whose cards report less free VRAM than their reserve, under ``enforce``."""


class ProbeFailed(ActionFailed):
    """A lane healthy by its health URL that failed one of its recipe's functional probes."""


class PortSquatted(ActionFailed):
    """A lane's health or probe port is held by a process outside its container: nothing was asked there."""


class ActionRefused(ActionFailed):
    """A preflight said no (the guard refused a reclaim, no tmpfs room): nothing was attempted. ``reason`` is a
    key of the metrics' refusal reasons."""

    def __init__(self, cause: str, *, reason: str):
        self.reason = reason
        super().__init__(cause)


class Cancelled(ReconcilerError):
    """A stop was requested (SIGINT/SIGTERM); the current action was abandoned at a safe point."""


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
    result: str  # "ok" | "failed" | "refused" | "interrupted"
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
    result: str  # "converged" | "blocked" | "failed" | "error" | "held" | "interrupted" | "changed"
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


class Applier:
    """Executes plans for one host. One instance per ``apply`` command or per loop."""

    def __init__(
        self,
        desired: DesiredState,
        *,
        observer: DockerObserver | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        hold: Mapping[str, str] | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        on_reclaim: Callable[[Any], None] | None = None,
        poll_s: float = 0.2,
        connect: bool = True,
    ):
        """``connect``: reach the engine now and raise ``DockerUnavailable`` ("docker source unavailable at URL:
        ...") when it does not answer (``reconciler apply``). The loop passes False: its passes observe the engine
        as a source like any other, report it down and wait for it."""
        self.desired = desired
        self.observer = observer or DockerObserver.for_host(desired.host)
        observer_ = self.observer
        self.ops = DockerOps(connect=lambda: observer_.api, url=observer_.url, ping=observer_.ping)
        if connect:
            self.ops.check()
        self.progress = progress or NoProgress()
        self.cancel = cancel or threading.Event()
        self.hold = dict(hold or {})
        self.on_outcome = on_outcome
        # Sees every guarded reclaim's ReclaimResult (the loop counts the files it kept as refusals).
        self.on_reclaim = on_reclaim
        self.poll_s = poll_s
        self._unknown_listeners: dict[str, str] = {}  # container id -> why its ports are not yet its own
        # The loop's view for the fallback: () -> (last converged topology, seconds to each held lane's next attempt).
        # None (``reconciler apply``): no fallback; a failed enter leaves its slots as they are.
        self.fallback_view: Callable[[], tuple[Any, Mapping[str, float]]] | None = None
        # Each running action's figures, per thread: actions on disjoint slots run at once (``_execute_group``).
        self._context = threading.local()
        # The guard stays serial (its two inspections see one deletion at a time), and the state and history files
        # are read, changed and written by one action at a time.
        self._guard_lock = threading.Lock()
        self._files_lock = threading.Lock()
        # How a group of actions runs: each in a thread of its own. The simulation replaces it with one that runs
        # them interleaved at their seams in an order its seed draws, so a run replays from its seed.
        self.run_group: Callable[[list[Callable[[], Outcome]]], list[Outcome]] = run_in_threads
        # What each observation looks up for the planner's checks of an enter's knowable failures.
        self._needs = enter_needs(desired)

    # ------------------------------------------------------------ observe + plan

    def observe(self) -> Observed:
        return observe(self.desired.host, docker=self.observer, **self._needs)

    def plan_now(self, extra_hold: Mapping[str, str] | None = None) -> tuple[Observed, Plan]:
        observed = self.observe()
        return observed, self.plan_of(observed, extra_hold)

    def plan_of(self, observed: Observed, extra_hold: Mapping[str, str] | None = None) -> Plan:
        """The plan for an observation, with this applier's holds and (in the loop) its fallback view."""
        last_good, next_attempt = self.fallback_view() if self.fallback_view else ((), {})
        return plan(
            self.desired,
            observed,
            hold={**self.hold, **(extra_hold or {})},
            last_good=last_good,
            next_attempt=next_attempt,
        )

    # ------------------------------------------------------------ the pass

    def converge(
        self,
        *,
        start: tuple[Observed, Plan] | None = None,
        max_steps: int | None = None,
        approved: Plan | None = None,
    ) -> PassResult:
        """One pass. ``start`` is an observation and its plan already shown to the operator, to act on as shown.

        With ``approved`` (the plan the operator saw and approved), only its actions run: after each action the
        host is planned again, and a next step that the approved plan does not hold ends the pass as
        ``changed`` instead of being done unseen. Without it (the loop) every step of the new plan runs.
        """
        t0 = time.monotonic()
        self._settle_ownership()
        observed, first = start or self.plan_now()
        result = self._converge_from(observed, first, max_steps=max_steps, approved=approved)
        result.seconds = time.monotonic() - t0
        return result

    def _settle_ownership(self) -> None:
        """Before a pass acts, under the host lock: the record of the containers this install created is brought up
        to date (docs/design.md, safety rule 9). An install from before that record records, once, the containers
        that carry its labels now; a create whose answer was lost gets its container's id recorded (found by its
        name and create token); ids of containers that are gone are forgotten. Nothing is written while the engine
        does not answer."""
        host = self.desired.host.name
        own = read_ownership(host)
        if own.install_id is None:
            return
        containers, source = self.observer.observe()
        if not source.ok:
            return
        with self._files_lock:
            if own.created is None:
                migrate_created(host, [c.id for c in containers if owner_kind(c, host, own) == "ours"])
            settle_created(host, [(c.id, c.name, c.label(LABEL_CREATE_TOKEN)) for c in containers])

    def _converge_from(
        self, observed: Observed, first: Plan, *, max_steps: int | None, approved: Plan | None = None
    ) -> PassResult:
        if first.unavailable:
            return PassResult("error", first, first, message=f"{_unavailable(observed)}; nothing changed")
        if first.blocked and not first.actions:
            return PassResult("blocked", first, first, message="; ".join(b.reason for b in first.blockers))
        # Blockers are scoped to their slots (the planner plans nothing on a blocked slot): what they do not touch
        # runs, and the pass ends blocked.
        outcomes: list[Outcome] = []
        failed: dict[str, str] = {}
        current = first
        limit = max_steps if max_steps is not None else 2 * len(first.actions) + 6
        # When each slot stopped serving in this pass (its old lane's leave began): an enter on it that succeeds
        # reports the slot's dark time from there.
        dark_since: dict[str, float] = {}
        while current.actions and len(outcomes) < limit:
            if self.cancel.is_set():
                return PassResult("interrupted", first, current, outcomes, "stop requested; nothing left half-owned")
            group = concurrent_group(current.actions)
            if approved is not None:
                shown = within(approved, group[0])
                if shown is None:
                    action = group[0]
                    unseen = (
                        f"the host changed after the plan was shown: the next step ({action.kind.value} "
                        f"{action.key}: {action.reason}) was not in it, so it was not done. "
                        "Run `reconciler plan` to see the new plan"
                    )
                    # A step of the shown plan that failed is the news (a failed enter leaves its crash's file to
                    # the next plan, whose reclaim is such an unseen step): the pass failed, and says both.
                    bad = [o for o in outcomes if o.result in ("failed", "refused")]
                    if bad:
                        return PassResult(
                            "failed", first, current, outcomes, "; ".join([*(o.detail for o in bad), unseen])
                        )
                    return PassResult("changed", first, current, outcomes, unseen)
                # The rest of the group runs only as far as the approved plan holds it; a step it does not hold
                # comes first in a later round and ends the pass there, unseen steps never run.
                group = [shown, *(a for a in (within(approved, b) for b in group[1:]) if a is not None)]
            group = group[: max(1, limit - len(outcomes))]
            if not self._room_for(group, observed):
                group = group[:1]  # together they do not fit the tmpfs: one at a time, each refused on its own
            started = time.monotonic()
            done = self._execute_group(group, observed)
            observed, current = self.plan_now(failed)
            done = [_with_dark(a, o, dark_since, started) for a, o in zip(group, done, strict=True)]
            stop: Outcome | None = None
            for action, outcome in zip(group, done, strict=True):
                if outcome.result == "ok" and _still_wanted(action, current):
                    outcome = Outcome(
                        action,
                        "failed",
                        outcome.seconds,
                        f"postcondition: after the {action.kind.value}, the plan still wants it ({_brief(current)})",
                        outcome.reclaimed_bytes,
                        extra=outcome.extra,
                    )
                outcomes.append(outcome)
                if self.on_outcome:
                    self.on_outcome(outcome)
                if outcome.result == "interrupted":
                    stop = stop or outcome
                if outcome.result in ("failed", "refused"):
                    failed[action.key] = f"{action.kind.value} failed in this pass: {outcome.detail}"
            if stop is not None:
                return PassResult("interrupted", first, current, outcomes, stop.detail)
            if any(o.result in ("failed", "refused") for o in done):
                observed, current = self.plan_now(failed)
            if current.unavailable:
                break
        bad = [o for o in outcomes if o.result in ("failed", "refused")]
        if bad:
            return PassResult("failed", first, current, outcomes, "; ".join(o.detail for o in bad))
        if current.unavailable:
            # the cause too, as before the first action: the operator reads why the pass stopped here
            return PassResult("error", first, current, outcomes, _unavailable(observed, current.unavailable))
        if current.blocked:
            return PassResult("blocked", first, current, outcomes, "; ".join(b.reason for b in current.blockers))
        if current.actions:
            return PassResult("failed", first, current, outcomes, f"did not converge after {len(outcomes)} actions")
        if current.held:
            return PassResult("held", first, current, outcomes, "; ".join(h.reason for h in current.held))
        from reconciler.store.history import record_topology

        record_topology(self.desired.host.name, [(a.recipe, a.slots) for a in self.desired.assignments])
        return PassResult("converged", first, current, outcomes)

    def _room_for(self, group: list[Action], observed: Observed) -> bool:
        """Whether the concurrent enters of ``group`` fit the tmpfs together, with its reserve (each enter's own
        preflight sees only the room before any of them started)."""
        need = sum(a.bytes for a in group if a.kind is ActionKind.ENTER and not a.container_id)
        if len(group) < 2 or not need:
            return True
        reserve = self.desired.host.shm.reserve_bytes
        return observed.shm.tmpfs.free_bytes >= need + reserve

    def _execute_group(self, group: list[Action], observed: Observed) -> list[Outcome]:
        """Run actions on disjoint slots at once (each with its own preflight, waits and postcondition), or one
        alone. The outcomes come back in the group's order."""
        if len(group) == 1:
            return [self._execute(group[0], observed)]
        if any(a.kind is ActionKind.ENTER for a in group):
            ensure_install_id(self.desired.host.name)  # made once, before the threads that would race to make it
        try:
            return self.run_group([functools.partial(self._execute, a, observed) for a in group])
        except GroupNotStarted as exc:
            # Those that ran have ended (their outcomes stand); those that never ran failed, saying why.
            return [
                o if o is not None else Outcome(a, "failed", 0.0, f"not started: {exc}")
                for a, o in zip(group, exc.results, strict=True)
            ]

    def _execute(self, action: Action, observed: Observed) -> Outcome:
        t0 = time.monotonic()
        refusal = ""
        self._announce(action)
        self._context.figures = {}
        try:
            if action.kind is ActionKind.ENTER:
                detail, freed = self.enter(action, observed)
            elif action.kind is ActionKind.LEAVE:
                detail, freed = self.leave(action, observed)
            elif action.kind is ActionKind.PRUNE:
                detail, freed = self.prune(action, observed)
            else:
                detail, freed = self.reclaim(action)
            result = "ok"
        except Cancelled as exc:
            detail, freed, result = str(exc), 0, "interrupted"
        except ActionRefused as exc:
            detail, freed, result, refusal = exc.cause, 0, "refused", exc.reason
        except ActionFailed as exc:
            detail, freed, result = exc.cause, 0, "failed"
        except ReconcilerError as exc:
            detail, freed, result = str(exc), 0, "failed"
        except Exception as exc:  # noqa: BLE001 - a Docker API error etc.: the action failed, say why
            detail, freed, result = f"{type(exc).__name__}: {exc}", 0, "failed"
        seconds = time.monotonic() - t0
        if result == "ok" and action.recipe and action.kind in (ActionKind.ENTER, ActionKind.LEAVE):
            from reconciler.store.history import record_duration

            with self._files_lock:
                record_duration(self.desired.host.name, action.recipe, action.kind.value, seconds)
        self.progress.done(action, result, seconds, detail)
        return Outcome(action, result, seconds, detail, freed, refusal, extra=dict(self._figures()))

    def _figures(self) -> dict[str, Any]:
        """The figures the action running in this thread measured so far (its drain, probes, VRAM, page cache)."""
        return getattr(self._context, "figures", {})

    def _note(self, key: str, value: Any) -> None:
        self._context.figures = {**self._figures(), key: value}

    # ------------------------------------------------------------ reclaim (through the one guard)

    def _guarded_reclaim(self, *, only_paths: list[str] | None = None, claimed: Collection[str] = ()) -> Any:
        from reconciler.apply.shm_guard import reclaim

        with self._guard_lock:
            res = reclaim(
                self.desired.host.shm,
                observe_docker=self.observer.observe,
                confirm=True,
                only_paths=only_paths,
                settled=lambda: read_ownership(self.desired.host.name).healthy,
                claimed=claimed,
            )
        if self.on_reclaim:
            self.on_reclaim(res)
        return res

    def reclaim(self, action: Action) -> tuple[str, int]:
        self.progress.phase(action, "two inspections", timeout=self.desired.host.shm.confirm_interval_s)
        res = self._guarded_reclaim(only_paths=list(action.paths))
        if res.refused:
            why = "offload_container_running" if res.blocking_containers else "source_unavailable"
            raise ActionRefused(f"reclaim refused: {res.refused}", reason=why)
        if res.reclaimed and not res.verified:
            raise ActionFailed(f"reclaim could not verify that {len(res.reclaimed)} removed file(s) are gone")
        if not res.reclaimed and res.kept:
            raise ActionFailed("reclaim kept every file: " + "; ".join(f"{k.path}: {k.reason}" for k in res.kept))
        return f"reclaimed {len(res.reclaimed)} file(s), {human_bytes(res.reclaimed_bytes)}", int(res.reclaimed_bytes)

    # ------------------------------------------------------------ enter

    def enter(self, action: Action, observed: Observed) -> tuple[str, int]:
        assert action.recipe is not None
        recipe = self.desired.recipes[action.recipe]
        slots = action.gpus
        freed = 0
        if action.container_id:
            # A container of ours left waiting for its health check (an apply stopped meanwhile): finish the wait
            # on it rather than restart a model load. It was created and started already; nothing to preflight.
            cid = action.container_id
            self.progress.phase(action, "finishing: waiting again for the container left waiting")
            return self._bring_up(action, recipe, cid, start=False, freed=0)
        # Preflight: the image, then tmpfs room for the offload file (orphans reclaimed through the guard).
        self.progress.phase(action, "preflight")
        if not self.ops.image_present(recipe.container.image):
            raise ActionFailed(
                f"image {recipe.container.image} is not present on this host: pull or build it "
                f"(recipe {action.recipe}, container.image)"
            )
        self._check_ports_free(action, recipe)
        self._check_health_url_free(action, recipe)
        need = recipe.offload.capacity_bytes
        reserve = self.desired.host.shm.reserve_bytes if need else 0
        # Orphans were reclaimed by the plan's own reclaim action before any enter; none is removed here that the
        # plan did not list.
        if need and observed.shm.tmpfs.free_bytes < need + reserve:
            raise ActionRefused(
                f"tmpfs {observed.shm.dir} has {human_bytes(observed.shm.tmpfs.free_bytes)} free; recipe "
                f"{action.recipe} needs {human_bytes(need)} for its offload file"
                + (f" and shm.reserve_gib keeps {human_bytes(reserve)} free beyond it" if reserve else "")
                + " (see `reconciler shm status`)",
                reason="tmpfs_room",
            )
        if self.cancel.is_set():
            raise Cancelled("stop requested before create; nothing created")
        # Act: create (labelled in the same call, so an interrupt never leaves it unowned), start, wait for health.
        self.progress.phase(action, "starting: create")
        install_id = ensure_install_id(self.desired.host.name)
        refs = recipe.container.env_refs().values()
        try:
            values = resolve_secrets(self.desired.host.secrets.env_file, refs) if refs else None
        except SecretError as exc:
            raise ActionFailed(f"recipe {action.recipe}: secret env value {exc}") from None
        create = create_spec(self.desired, action.recipe, slots, install_id=install_id, secrets=values)
        # The proof of ownership: the create's token is recorded before the create (a lost answer still names the
        # container by its name and token), its id once the engine answers (docs/design.md, safety rule 9).
        token = secrets.token_hex(16)
        create["labels"] = {**create["labels"], LABEL_CREATE_TOKEN: token}
        host = self.desired.host.name
        with self._files_lock:
            record_pending(host, create["name"], token)
        cid = self.ops.create(create)
        with self._files_lock:
            record_created(host, cid, token=token)
        return self._bring_up(action, recipe, cid, start=True, freed=freed)

    def _bring_up(
        self,
        action: Action,
        recipe: Recipe,
        cid: str,
        *,
        start: bool,
        freed: int,
    ) -> tuple[str, int]:
        """Start (unless it runs already), wait for health, check, and record the container as healthy."""
        slots = action.gpus
        try:
            # From create to settled the engine loads its model through the page cache: no drop meanwhile.
            with pagecache.entering():
                if start:
                    self.progress.phase(action, "starting")
                    self.ops.start(cid)
                self._wait_healthy(action, cid, recipe)
                after = self._check_enter(action, cid)
            verdict = self.check_reserve(action, after)
        except ActionFailed as exc:
            self._fail_enter(action, cid, exc)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine error once the container exists (a 5xx on inspect
            # after its retries): the same failed-enter path, so the container is stopped and kept, never left running
            # while the loop backs off and a fallback could be entered on its cards
            self._fail_enter(action, cid, ActionFailed(f"{type(exc).__name__}: {exc}"))
        # Only now does it count as satisfied: one left waiting by an interrupt is finished by the next pass.
        containers, docker_ok = self.observer.observe()
        with self._files_lock:
            mark_healthy(self.desired.host.name, cid, existing=[c.id for c in containers] if docker_ok.ok else None)
        detail = f"{action.container} healthy on {','.join(slots)}"
        if freed:
            detail += f" (reclaimed {human_bytes(freed)} of orphan offload files first)"
        if verdict.checked:
            detail += f"; free VRAM {verdict.message()}"
            if verdict.below:
                detail += " (gpu_reserve policy report: the lane stays)"
        under = self._figures().get("vram_under_load") or {}
        if under.get("below"):
            detail += f"; under its preflight's load {', '.join(under['below'])} fell below the reserve (policy report)"
        return detail, freed

    def check_reserve(self, action: Action, observed: Observed) -> ReserveVerdict:
        """The free VRAM of the enter's slots, sampled once its lane is healthy and settled, against their
        reserve. Under ``enforce`` a slot below it (or with no figure) raises ``BelowReserve``: the enter failed.
        Under ``report`` the verdict goes into the outcome and the lane stays."""
        verdict = enter_reserve_verdict(self.desired, action.recipe, observed.gpus, action.gpus)
        self._note("gpu_reserve", verdict.to_json())
        if verdict.failed:
            how = "end below the free-VRAM reserve" if verdict.below else "report no free-VRAM figure to check"
            raise BelowReserve(
                f"{action.container} is healthy but its GPUs {how} (gpu_reserve policy enforce): {verdict.message()}"
            )
        return verdict

    def _wait_healthy(self, action: Action, cid: str, recipe: Recipe) -> None:
        h = recipe.health
        t0 = time.monotonic()
        running_since: float | None = None
        restarts: int | None = None
        while True:
            elapsed = time.monotonic() - t0
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while waiting for {action.container}; it keeps its labels")
            st = self.ops.inspect(cid).get("State") or {}
            if st.get("Status") in ENDED_STATES:
                raise ActionFailed(f"{action.container} exited with code {st.get('ExitCode')} during start")
            if st.get("Status") == "running":
                running_since = running_since or time.monotonic()
                count = int(st.get("RestartCount") or 0)
                if restarts is not None and count != restarts:
                    running_since = time.monotonic()
                restarts = count
                if h.url:
                    # Asked only once every listener on its ports is the container's own: a squatter is named,
                    # never asked (it would answer the health check and receive the probes' prompts).
                    if self._ports_ours(action, cid, recipe) and _http_ok(h.url):
                        self._settle_after_health(action, cid, recipe, restarts)
                        self._require_ports_ours(action, cid, recipe)
                        self._run_probes(action, recipe)
                        return
                elif time.monotonic() - running_since >= h.settle_s:
                    self._require_ports_ours(action, cid, recipe)
                    self._run_probes(action, recipe)
                    return
            if elapsed >= h.start_timeout_s:
                unknown = self._unknown_listeners.pop(cid, None)
                raise ActionFailed(
                    f"{action.container} not healthy within {h.start_timeout_s:g} s "
                    f"({'GET ' + h.url if h.url else 'running for settle_s'}); raise health.start_timeout_s "
                    "in the recipe if it needs longer" + (f" ({unknown}; it was never asked)" if unknown else "")
                )
            # Without a health URL the lane is serving once it ran, not restarted, for settle_s: say that, not a
            # wait for a URL it does not have.
            waiting = (
                "waiting for its health URL"
                if h.url
                else f"no health URL: serving once running and not restarted for settle_s ({h.settle_s:g} s)"
            )
            self.progress.phase(action, f"loading: {waiting}", elapsed=elapsed, timeout=h.start_timeout_s)
            time.sleep(self.poll_s)

    def _run_probes(self, action: Action, recipe: Recipe) -> None:
        """The recipe's ``preflight`` suite, once its health URL answered: each probe in order, the first that
        fails fails the enter (``ProbeFailed``: the reason names the probe and what came back). Meanwhile the free
        VRAM of its cards is sampled; under ``enforce`` a card whose lowest figure is below its reserve fails the
        enter too (``BelowReserve``, naming the card, the figure and the probe that was running then)."""
        from reconciler.apply.probes import ProbeSpec, run_suite
        from reconciler.store.probe_history import record_suite

        def before(probe: ProbeSpec, i: int, n: int) -> None:
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while probing {action.container}; it keeps its labels")
            self.progress.phase(action, f"probes: {probe.name} ({i + 1}/{n})", timeout=probe.timeout_s)

        assert action.recipe is not None
        run = run_suite(
            self.desired, action.recipe, "preflight", slots=action.gpus, before=before, stop_at_failure=True
        )
        self._note("probes", [r.to_json() for r in run.results])
        self._note("vram_under_load", run.vram.to_json())
        if run.planned:
            record_suite(self.desired.host.name, run.to_json())
        failed = run.first_failure
        if failed is not None:
            raise ProbeFailed(failed.reason())
        if run.vram.failed:
            how = "fell below the free-VRAM reserve" if run.vram.below else "gave no free-VRAM figure to check"
            raise BelowReserve(
                f"{action.container} passed its preflight probes, but under their load its GPUs {how} "
                f"(gpu_reserve policy enforce): {run.vram.message()}"
            )

    def _drain(self, action: Action, c: Any, recipe: Recipe | None, observed: Observed) -> str:
        """Before a lane leaves: wait until it runs and queues no request (vLLM's ``vllm:num_requests_running`` and
        ``vllm:num_requests_waiting`` on its /metrics), at most ``drain.timeout_s``; then it is stopped anyway. A lane
        that is not running, never passed its health check or does not answer it now is failing: not drained.
        Returns the note for the outcome's detail; the figures go into the outcome as ``drain``."""
        from reconciler.apply.vllm_metrics import read_gauges

        def note(record: dict[str, Any], text: str) -> str:
            self._note("drain", {**record, "note": text})
            return text

        skipped = {"drained": False, "timed_out": False, "seconds": 0.0}
        if recipe is None:
            return note(skipped, "not drained: its recipe is gone, so its metrics URL is unknown")
        if not recipe.drain.enabled:
            return note(skipped, "not drained: drain.enabled = false in its recipe")
        url = recipe.drain_metrics_url()
        if not c.active or c.id not in observed.ownership.healthy:
            return note(skipped, "not drained: it is not a healthy lane")
        if url is None:
            return note(skipped, "not drained: its recipe has no health.url or drain.metrics_url")
        if recipe.health.url and not _http_ok(recipe.health.url):
            return note(skipped, f"not drained: its health URL {recipe.health.url} does not answer (a failing lane)")
        gauges = read_gauges(url)
        if isinstance(gauges, str):
            return note(skipped, f"not drained: {gauges}")
        timeout = recipe.drain.timeout_s
        t0 = time.monotonic()
        first = int(gauges[0] + gauges[1])
        while True:
            running, waiting = gauges
            elapsed = time.monotonic() - t0
            record = {
                "drained": False,
                "timed_out": False,
                "seconds": round(elapsed, 3),
                "requests_at_start": first,
                "running": int(running),
                "waiting": int(waiting),
                "timeout_s": timeout,
                "url": url,
            }
            if running + waiting <= 0:
                record["drained"] = True
                if not first:
                    return note(record, "drained: no request in flight")
                return note(record, f"drained {first} request(s) in {elapsed:.1f} s")
            if elapsed >= timeout:
                record["timed_out"] = True
                return note(
                    record,
                    f"drain timed out after {timeout:g} s with {int(running)} running and "
                    f"{int(waiting)} waiting: stopped anyway",
                )
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while draining {c.name}; it still runs")
            self.progress.phase(
                action, f"draining: {int(running)} running, {int(waiting)} waiting", elapsed=elapsed, timeout=timeout
            )
            time.sleep(min(self.poll_s, max(0.01, timeout - elapsed)))
            gauges = read_gauges(url)
            if isinstance(gauges, str):
                record["seconds"] = round(time.monotonic() - t0, 3)
                return note(record, f"drain ended: {gauges}")

    def _announce(self, action: Action) -> None:
        """Tell the progress how long this recipe's earlier enters or leaves took (none for a reclaim)."""
        expect = getattr(self.progress, "expect", None)
        if expect is None or action.kind not in (ActionKind.ENTER, ActionKind.LEAVE) or not action.recipe:
            return
        from reconciler.store.history import expected

        past = expected(self.desired.host.name, action.recipe, action.kind.value)
        expect(action, past[0] if past else None, past[1] if past else 0)

    def _check_ports_free(self, action: Action, recipe: Recipe) -> None:
        """Preflight: nothing listens on the lane's health and probe ports before its container exists; whatever
        does is named (read from /proc, never asked: a squatter must not receive a request)."""
        ports = lane_ports(recipe)
        if not ports:
            return
        view = _port_listeners(ports)
        if view is None:
            return  # /proc/net unreadable here: the HTTP check below still refuses anything that answers
        for port, held in sorted(view.items()):
            if held:
                raise PortSquatted(
                    f"port {port} ({ports[port]}) of recipe {action.recipe} is already bound before "
                    f"{action.container} is started: {_holders_text(held)}. Its health check and probes could not "
                    "tell the new engine from it, so nothing was asked there and nothing was created. Stop what "
                    "listens there, or give the recipe another port and health.url"
                )

    def _port_verdict(self, action: Action, cid: str, recipe: Recipe) -> tuple[bool, str]:
        """Whether every listener on the lane's health and probe ports is a process of container ``cid``:
        (True, "") when each port has listeners and all are its own; (False, why) while one is not listening yet
        or its holder is not known. A listener of another process raises PortSquatted, naming it."""
        ports = lane_ports(recipe)
        if not ports or recipe.container.network != "host":
            return True, ""  # off the host's network, the host's sockets are not where its ports are
        view = _port_listeners(ports)
        if view is None:
            return False, "the listening sockets could not be read from /proc/net/tcp"
        for port, held in sorted(view.items()):
            if not held:
                return False, f"nothing listens on port {port} ({ports[port]}) yet"
            for listener, holders in held:
                if not holders:
                    return False, (
                        f"port {port} ({ports[port]}) is held by a socket of uid {listener.uid} "
                        f"({listener.where}, inode {listener.inode}) that no readable process holds"
                    )
                foreign = [h for h in holders if not h.of(cid)]
                if foreign:
                    raise PortSquatted(
                        f"port {port} ({ports[port]}) of {action.container} is held by "
                        f"{_holders_text([(listener, foreign)])}, not by a process of the container: another "
                        "process took the lane's port while it started, so its health answer and probes would "
                        "come from that process. Nothing was asked there; stop what listens there, or give the "
                        "recipe another port and health.url"
                    )
        return True, ""

    def _ports_ours(self, action: Action, cid: str, recipe: Recipe) -> bool:
        ok, why = self._port_verdict(action, cid, recipe)
        if ok:
            self._unknown_listeners.pop(cid, None)
        elif why:
            self._unknown_listeners[cid] = why
        return ok

    def _require_ports_ours(self, action: Action, cid: str, recipe: Recipe) -> None:
        """Before the probes: the ports are still the container's own (PortSquatted names a holder that is not)."""
        ok, why = self._port_verdict(action, cid, recipe)
        if not ok:
            raise PortSquatted(f"{action.container}'s probes were not sent: {why}")

    def _check_health_url_free(self, action: Action, recipe: Recipe) -> None:
        """Preflight: nothing may answer the health URL before the container starts. If something does (a stale
        server on the port, another lane with host networking), a health check would pass for it and report a
        container healthy that dies moments later on "Address already in use"."""
        url = recipe.health.url
        if not url:
            return
        what = _http_answer(url)
        if what is not None:
            raise ActionFailed(
                f"health URL {url} of recipe {action.recipe} already answers ({what}) before {action.container} "
                "is started: something else serves on its port (a stale server, another lane with host "
                "networking), so its health check cannot tell the new engine from it. Stop what listens there, "
                "or give the recipe another port and health.url; nothing was created"
            )

    def _settle_after_health(self, action: Action, cid: str, recipe: Recipe, restarts: int | None) -> None:
        """After the health URL answered: the container must still be running then, and still after settle_s."""
        h = recipe.health

        def check(when: str) -> None:
            st = self.ops.inspect(cid).get("State") or {}
            status = st.get("Status")
            if status != "running":
                how = f"exited with code {st.get('ExitCode')}" if status in ENDED_STATES else f"is {status}"
                raise ActionFailed(
                    f"{action.container} {how} {when}: what answered {h.url} was not (only) this container"
                )
            if restarts is not None and int(st.get("RestartCount") or 0) != restarts:
                raise ActionFailed(f"{action.container} restarted {when}")

        check("right after its health URL answered")
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < h.settle_s:
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while {action.container} settles; it keeps its labels")
            self.progress.phase(action, "health: answered, settling", elapsed=elapsed, timeout=h.settle_s)
            time.sleep(min(self.poll_s, max(0.0, h.settle_s - elapsed)))
            check(f"within health.settle_s ({h.settle_s:g} s) after its health URL answered")

    def _check_enter(self, action: Action, cid: str) -> Observed:
        """Postcondition: running and holding exactly its slots (by Docker, and by NVML where it is on).
        Returns that observation (its GPU figures are the enter's free-VRAM sample)."""
        observed = self.observe()
        mine = next((c for c in observed.containers if c.id == cid), None)
        if mine is None or not mine.active:
            raise ActionFailed(f"{action.container} is not running after it became healthy")
        held = {slot for slot, cs in slot_holders(self.desired, observed).items() if mine in cs}
        if held != set(action.gpus):
            raise ActionFailed(f"{action.container} holds slots {sorted(held)}, expected {list(action.gpus)}")
        if observed.gpus.telemetry == "nvml":
            if not observed.gpus.source.ok:
                raise ActionFailed(f"GPU telemetry unavailable after enter: {observed.gpus.source.detail}")
            on = set(slots_of_container(observed.gpus, cid))
            # A slot where NVML cannot attribute processes (WSL2) is not held against the container; a process of
            # it on a slot outside its own always is.
            blind = set(unattributable_slots(observed.gpus, set(action.gpus) - on))
            if on - set(action.gpus) or set(action.gpus) - on - blind:
                raise ActionFailed(
                    f"{action.container} is healthy but NVML sees its processes on {sorted(on) or 'no GPU'}, "
                    f"expected exactly {list(action.gpus)}"
                )
        return observed

    def _fail_enter(self, action: Action, cid: str, exc: ActionFailed) -> None:
        """Keep the failed container for its logs, reclaim its unmapped shm, free the GPUs; then raise."""
        self.progress.phase(action, "failed: keeping the container, reclaiming its shm")
        logs = self.ops.logs_tail(cid)
        # Its own offload files: those its container is seen holding now, and no other process. The only ones this
        # failed enter reclaims (the guard still proves each unowned, twice). A file that merely appeared since its
        # create may be another program's: a crash before its container was seen mapping it leaves it to the next
        # plan, which reclaims it as an orphan once nothing can own it.
        now = self.observe()
        names = {c.name for c in now.containers if c.id == cid} | {cid, cid[:12]}
        its_files = [f.path for f in now.shm.files if f.owners and all(o.container in names for o in f.owners)]
        try:
            self.ops.stop(cid, 5)
        except Exception:  # noqa: BLE001 - a stop that fails for good: kill it, and say so below if it still runs
            self.ops.kill(cid)
        try:
            kept = self.ops.preserve(cid, action.container or cid[:12])
        except Exception as err:  # noqa: BLE001 - the name stays taken; the next plan sees a stopped container of ours
            kept = f"{action.container or cid[:12]} (not renamed: {type(err).__name__}: {err})"
        self._prune_kept(action.container or cid[:12])
        freed_note = ""
        res = self._guarded_reclaim(only_paths=its_files, claimed=its_files)
        if res.reclaimed_bytes:
            freed_note = f"; reclaimed {res.reclaimed_bytes} bytes of its offload file"
        elif res.refused:
            freed_note = f"; its offload file was not reclaimed: {res.refused}"
        observed = self.observe()
        still = [c.name for c in observed.containers if c.id == cid and c.active]
        cause = (
            exc.cause
            if isinstance(exc, (BelowReserve, ProbeFailed, PortSquatted))
            else (_cause_from_logs(logs) or exc.cause)
        )
        msg = f"enter {action.recipe} on {','.join(action.gpus)} failed: {cause}. Kept as {kept} (docker logs {kept}){freed_note}"
        if still:
            msg += f"; WARNING: {still[0]} is still running"
        raise ActionFailed(msg, detail=logs)

    def _prune_kept(self, name: str) -> None:
        """A recipe that keeps failing must not pile up stopped containers: keep the newest ``keep_failed``."""
        docker = self.desired.host.docker
        try:
            own = read_ownership(self.desired.host.name)
            owned = None if own.created is None else own.created | own.adopted
            self.ops.prune_kept(
                name, host=self.desired.host.name, keep=docker.keep_failed, install_id=own.install_id, owned=owned
            )
        except Exception:  # noqa: BLE001 - pruning old evidence must never fail the action that made new evidence
            return

    # ------------------------------------------------------------ prune

    def prune(self, action: Action, observed: Observed) -> tuple[str, int]:
        """Remove a failed container of ours kept for its logs, once the plan says it goes (its assignment gone, or
        older than the newest ``docker.keep_failed``). Only while it is still stopped: one started meanwhile (by
        hand) is left as it is."""
        cid = action.container_id
        assert cid is not None
        if not any(c.id == cid for c in observed.containers):
            return f"{action.container} already gone", 0
        import docker.errors

        try:
            status = (self.ops.inspect(cid).get("State") or {}).get("Status")
        except docker.errors.NotFound:
            return f"{action.container} already gone", 0
        if status not in INACTIVE_STATES:
            raise ActionFailed(f"{action.container} is {status} now, no longer a stopped kept container: left as it is")
        self.ops.remove(cid)
        return f"{action.container} removed (a failed container kept for its logs)", 0

    # ------------------------------------------------------------ leave

    def leave(self, action: Action, observed: Observed) -> tuple[str, int]:
        cid = action.container_id
        assert cid is not None
        c = next((x for x in observed.containers if x.id == cid), None)
        if c is None:
            return f"{action.container} already gone", 0
        recipe = self.desired.recipes.get(c.recipe or "")
        timeout = recipe.stop.timeout_s if recipe else DEFAULT_STOP_TIMEOUT_S
        drained = self._drain(action, c, recipe, observed)
        if c.active:
            self.progress.phase(action, "stopping", timeout=timeout)
            self.ops.stop(cid, timeout)
        info = self.ops.inspect(cid)
        code = (info.get("State") or {}).get("ExitCode")
        never_started = c.state in NEVER_STARTED_STATES
        if never_started or code in CLEAN_EXIT_CODES:
            self.ops.remove(cid)
            fate = "removed"
        else:
            kept = self.ops.preserve(cid, c.name)
            self._prune_kept(c.name)
            fate = f"exited with code {code}: kept as {kept} for its logs"
        freed = 0
        # Exactly the files its plan listed (safety rule 13): those only its container held, and on the last leave
        # of the running offload containers the orphans they kept; a file it shared with another holder stays.
        paths = list(action.paths)
        if paths:
            self.progress.phase(action, "reclaiming its offload files")
            # Those it was the only one seen holding are its own: no running offload container keeps them.
            names = {c.name, c.id, c.id[:12]}
            own = [
                f.path
                for f in observed.shm.files
                if f.path in paths and f.owners and all(o.container in names for o in f.owners)
            ]
            freed = int(self._guarded_reclaim(only_paths=paths, claimed=own).reclaimed_bytes)
        # Postcondition: not running, its slots free of every container, none of its listed files left unowned (one
        # that another process took meanwhile is that process's now, and the next plan sees it so).
        after = self.observe()
        if any(x.id == cid and x.active for x in after.containers):
            raise ActionFailed(f"{c.name} is still running after stop")
        held = slot_holders(self.desired, after)
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
        if self.desired.host.page_cache.drop_after_leave:
            # After the leave's postcondition, so nothing of it waits on the drop; pagecache refuses while an
            # enter waits for health.
            self.progress.phase(action, "dropping clean page cache")
            drop = pagecache.drop_page_cache()
            self._note("page_cache", drop.to_json())
            detail += f"; {drop.describe()}"
        return detail, freed


# ---------------------------------------------------------------- helpers


def _url_port(url: str) -> int | None:
    parts = urlsplit(url)
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def lane_ports(recipe: Recipe) -> dict[int, str]:
    """port -> what asks there (its health URL, a probe's base URL), of every port an enter sends a request to."""
    out: dict[int, str] = {}
    urls = [("health.url", recipe.health.url)]
    origin = recipe.api_origin()
    urls += [(f"probe {p.name!r}", p.base_url or origin) for p in recipe.suite("preflight")]
    for what, url in urls:
        port = _url_port(url) if url else None
        if port is not None:
            out.setdefault(port, what)
    return out


@dataclass(frozen=True)
class PortHolder:
    """A process holding a listening socket: its pid, program and the container ids on its cgroup path."""

    pid: int
    comm: str
    containers: tuple[str, ...]

    def of(self, cid: str) -> bool:
        """In container ``cid`` (its cgroup path names it, as offload holders are attributed)."""
        return any(c == cid or (len(cid) >= 12 and c.startswith(cid)) for c in self.containers)


PortView = dict[int, list[tuple[TcpListener, list[PortHolder]]]]


def _port_listeners(ports: Mapping[int, str]) -> PortView | None:
    """port -> each socket listening on it (any local address) with the processes that hold it, from /proc; None
    when /proc/net/tcp cannot be read. The simulation replaces this seam."""
    try:
        listeners = [sock for sock in read_tcp_listeners() if sock.port in ports]
    except OSError:
        return None
    pids = socket_holders([sock.inode for sock in listeners]) if listeners else {}
    view: PortView = {port: [] for port in ports}
    for sock in listeners:
        holders = [
            PortHolder(pid, read_comm(pid), procfs.container_candidates_of_pid(pid))
            for pid in sorted(pids.get(sock.inode, ()))
        ]
        view[sock.port].append((sock, holders))
    return view


def _holders_text(held: list[tuple[TcpListener, list[PortHolder]]]) -> str:
    """The holders of listening sockets in words: pid, program, user, container, address."""
    parts = []
    for sock, holders in held:
        if not holders:
            parts.append(f"a socket of uid {sock.uid} on {sock.where} that no readable process holds")
        for h in holders:
            where = f" in container {h.containers[0][:12]}" if h.containers else ""
            parts.append(f"pid {h.pid} ({h.comm}, {_user_name(sock.uid)}){where} listening on {sock.where}")
    return "; ".join(parts)


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _http_ok(url: str) -> bool:
    """The health URL answers 2xx (never through a proxy: reconciler.base.direct_http)."""
    try:
        with direct_http.opener().open(url, timeout=1.0) as resp:
            return 200 <= resp.status < 300
    except direct_http.errors():
        return False


def _http_answer(url: str, *, timeout: float = 1.0) -> str | None:
    """What answers ``url`` now, in words ("HTTP 200", "HTTP 404", a connection that says nothing), or None when
    nothing listens there (the connection is refused, the host is unknown or unreachable). Never via a proxy."""
    import urllib.error
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError:
        return None  # refused, unreachable, unknown host, or no answer to the connect: nothing listens
    try:
        with direct_http.opener().open(url, timeout=timeout) as resp:
            return f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except direct_http.errors() as exc:
        reason = getattr(exc, "reason", exc)
        return f"a listener on port {port} that accepts connections ({type(reason).__name__})"


def _cause_from_logs(logs: str) -> str:
    """The line an operator needs first: the report's Errno 14, or the last error-looking line."""
    lines = [ln.strip() for ln in logs.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Errno 14" in ln or "Bad address" in ln:
            return f"{ln} (the offload mmap could not be prefaulted: the tmpfs is out of room)"
    for ln in reversed(lines):
        low = ln.lower()
        if "error" in low or "exception" in low or "fatal" in low:
            return ln
    return ""


def _unavailable(observed: Observed, names: Iterable[str] = ()) -> str:
    """A pass's message for sources that did not answer: each with its cause (``names``: the plan's, where the
    observation holds none)."""
    down = [f"{s.name} ({s.detail})" for s in observed.unavailable()] or list(names)
    return "source unavailable: " + ", ".join(down)


def _with_dark(action: Action, outcome: Outcome, dark_since: dict[str, float], started: float) -> Outcome:
    """Record a leave's slots as dark from its start; give a successful enter its slots' dark time."""
    if action.kind is ActionKind.LEAVE and outcome.result == "ok":
        for slot in action.gpus:
            dark_since.setdefault(slot, started)
        return outcome
    if action.kind is not ActionKind.ENTER or outcome.result != "ok":
        return outcome
    end = started + outcome.seconds
    dark = {slot: round(end - dark_since.pop(slot, started), 3) for slot in action.gpus}
    return replace(outcome, extra={**outcome.extra, "dark_s": dark})


def concurrent_group(actions: tuple[Action, ...]) -> list[Action]:
    """Pure: the plan's first action and the actions right after it that may run at the same time: of the same kind
    (leaves, then enters; a reclaim always alone) and on slots none of the others uses."""
    first = actions[0]
    group = [first]
    if first.kind is ActionKind.RECLAIM:
        return group
    used = set(first.gpus)
    for a in actions[1:]:
        if a.kind is not first.kind or not a.gpus or used & set(a.gpus):
            break
        group.append(a)
        used |= set(a.gpus)
    return group


class GroupNotStarted(ReconcilerError):
    """A thread of a group could not be started: raised by ``run_in_threads`` once every thread it did start has
    ended. ``results``: each call's outcome in the calls' order, None for those that never ran."""

    def __init__(self, message: str, results: list[Outcome | None]):
        super().__init__(message)
        self.results = results


def run_in_threads(calls: list[Callable[[], Outcome]]) -> list[Outcome]:
    """Run each call in a thread of its own; their results in the calls' order. A thread that cannot be started
    (the process at its limit) starts no later one, and the group still ends only when each started thread has
    ended (a pass never leaves an action running behind it): then GroupNotStarted says which."""
    results: list[Outcome | None] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), name=f"action-{i}", daemon=True) for i in range(len(calls))]
    started: list[threading.Thread] = []
    failure = ""
    for i, t in enumerate(threads):
        try:
            t.start()
        except RuntimeError as exc:
            failure = f"action {i + 1} of {len(calls)} could not be given a thread ({type(exc).__name__}: {exc})"
            break
        started.append(t)
    for t in started:
        t.join()
    if failure:
        raise GroupNotStarted(failure, results)
    return [r for r in results if r is not None]


def within(approved: Plan, action: Action) -> Action | None:
    """Pure: ``action`` as far as the approved plan holds it, or None when it holds no such step.

    A leave must name the same container, an enter the same assignment and recipe hash; a reclaim keeps only
    the paths the approved plan listed (the operator saw those, and no others).
    """
    for a in approved.actions:
        if a.kind is not action.kind:
            continue
        if action.kind is ActionKind.LEAVE and a.container_id == action.container_id:
            paths = tuple(p for p in action.paths if p in set(a.paths))
            return replace(action, paths=paths) if paths != action.paths else action
        if action.kind is ActionKind.ENTER and a.key == action.key and a.recipe_hash == action.recipe_hash:
            return action
        if action.kind is ActionKind.RECLAIM:
            paths = tuple(p for p in action.paths if p in set(a.paths))
            if paths:
                return replace(action, paths=paths) if paths != action.paths else action
        if action.kind is ActionKind.PRUNE and a.container_id == action.container_id:
            return action
    return None


def _still_wanted(action: Action, current: Plan) -> bool:
    for a in current.actions:
        if a.kind is not action.kind:
            continue
        if action.kind is ActionKind.LEAVE and a.container_id == action.container_id:
            return True
        if action.kind is ActionKind.ENTER and a.key == action.key:
            return True
        if action.kind is ActionKind.RECLAIM and set(a.paths) & set(action.paths):
            return True
        if action.kind is ActionKind.PRUNE and a.container_id == action.container_id:
            return True
    return False


def _brief(p: Plan) -> str:
    return "; ".join(f"{a.kind.value} {a.key}: {a.reason}" for a in p.actions[:3]) or "nothing"
