"""The apply layer's pass: ``Applier.converge()``, the only part of the tool that changes the host.

One converge pass: observe, plan, execute the first action (or a group of them on disjoint slots, at once),
observe again and re-plan, until the plan is empty, blocked, or an action failed. Each action has a preflight, the
act, and a postcondition; an action is done when the new plan has nothing left for it. With an approved plan only
its steps run. Called by ``reconciler apply`` (through the service) and the loop.

The steps of each action kind are objects and functions over one value, the applier's ``ActionContext``
(``reconciler.apply.context``): ``reconciler.apply.enter`` (with ``.port_checks`` and ``.serving``),
``reconciler.apply.leave`` (with ``.drain``) and ``reconciler.apply.sleep``; a reclaim goes through the one shm
guard (``reconciler.apply.shm_guard``). Everything this layer creates carries the ownership
labels from the create call on, so an interrupted pass never leaves an unowned container behind.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.apply.context import ActionContext
from reconciler.apply.engine_ops import EngineOps
from reconciler.apply.enter import EnterSteps
from reconciler.apply.errors import ActionFailed, ActionRefused, Cancelled, Superseded
from reconciler.apply.groups import GroupNotStarted, concurrent_group
from reconciler.apply.host_io import REAL_IO, HostIO
from reconciler.apply.leave import leave, prune
from reconciler.apply.passes import PassRun, as_approved, postcondition, unavailable_message, with_dark
from reconciler.apply.results import NoProgress, Outcome, OutcomeResult, PassResult, Progress
from reconciler.apply.serving import check_reserve
from reconciler.apply.sleep import SleepSteps
from reconciler.base.errors import ReconcilerError
from reconciler.base.units import human_bytes
from reconciler.model import DesiredState
from reconciler.observe.containers import EngineObserver
from reconciler.plan.actions import Action, ActionKind, Plan
from reconciler.plan.claims import owner_kind
from reconciler.plan.observed import LABEL_CREATE_TOKEN, Observed
from reconciler.plan.planner import plan
from reconciler.plan.vram import ReserveVerdict
from reconciler.store.history import expected, record_duration, record_topology
from reconciler.store.state import ensure_install_id, migrate_created, read_ownership, settle_created


class Applier:
    """Executes plans for one host. One instance per ``apply`` command or per loop.

    Its steps are objects and functions over one value, ``context`` (``reconciler.apply.context.ActionContext``):
    what the applier was given and set up, shared by every step of every action it runs."""

    def __init__(
        self,
        desired: DesiredState,
        *,
        observer: EngineObserver | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        hold: Mapping[str, str] | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        on_reclaim: Callable[[Any], None] | None = None,
        poll_s: float = 0.2,
        connect: bool = True,
        io: HostIO | None = None,
    ):
        """``connect``: reach the engine now and raise ``DockerUnavailable`` ("docker source unavailable at URL:
        ...") when it does not answer (``reconciler apply``). The loop passes False: its passes observe the engine
        as a source like any other, report it down and wait for it. ``io``: the host's I/O seams (``REAL_IO``, or
        the simulation's world), through which every step, the guard and the observation reach the host.
        ``on_reclaim`` sees every guarded reclaim's ReclaimResult (the loop counts the files it kept as refusals)."""
        io = io or REAL_IO
        observer = observer or io.engine(desired.host)
        ops = EngineOps(connect=observer.writes, url=observer.url, ping=observer.ping, clock=io.clock)
        if connect:
            ops.check()
        self.context = ActionContext(
            desired,
            io,
            observer,
            ops,
            progress or NoProgress(),
            cancel or threading.Event(),
            on_reclaim=on_reclaim,
            poll_s=poll_s,
        )
        self.hold = dict(hold or {})
        self.on_outcome = on_outcome
        self._enter = EnterSteps(self.context)
        self._sleep = SleepSteps(self.context)

    # What the applier was given, held once by its context (every step reads it there).
    @property
    def desired(self) -> DesiredState:
        return self.context.desired

    @property
    def io(self) -> HostIO:
        return self.context.io

    @property
    def observer(self) -> EngineObserver:
        return self.context.observer

    @property
    def ops(self) -> EngineOps:
        return self.context.ops

    @property
    def progress(self) -> Progress:
        return self.context.progress

    @property
    def cancel(self) -> threading.Event:
        return self.context.cancel

    @property
    def on_reclaim(self) -> Callable[[Any], None] | None:
        return self.context.on_reclaim

    @property
    def fallback_view(self) -> Callable[[], tuple[Any, Mapping[str, float]]] | None:
        """The loop's view for the fallback: () -> (last converged topology, seconds to each held lane's next
        attempt). None (``reconciler apply``): no fallback; a failed enter leaves its slots as they are."""
        return self.context.fallback_view

    @fallback_view.setter
    def fallback_view(self, view: Callable[[], tuple[Any, Mapping[str, float]]] | None) -> None:
        self.context.fallback_view = view

    @property
    def superseded(self) -> Callable[[Action], str | None] | None:
        """The loop's check of an edit made while an enter waits for health: why the enter's lane is no longer
        wanted (None while it is). None (``reconciler apply``: its plan was approved as shown): never asked."""
        return self.context.superseded

    @superseded.setter
    def superseded(self, check: Callable[[Action], str | None] | None) -> None:
        self.context.superseded = check

    def observe(self) -> Observed:
        """The host now (``ActionContext.observe``)."""
        return self.context.observe()

    # The steps of each action kind, over the context.
    def enter(self, action: Action, observed: Observed) -> tuple[str, int]:
        return self._enter.enter(action, observed)

    def leave(self, action: Action, observed: Observed) -> tuple[str, int]:
        return leave(self.context, action, observed)

    def prune(self, action: Action, observed: Observed) -> tuple[str, int]:
        return prune(self.context, action, observed)

    def sleep_lane(self, action: Action, observed: Observed) -> tuple[str, int]:
        return self._sleep.sleep_lane(action, observed)

    def wake_lane(self, action: Action, observed: Observed) -> tuple[str, int]:
        return self._sleep.wake_lane(action, observed)

    def check_reserve(self, action: Action, observed: Observed) -> ReserveVerdict:
        """An enter's free-VRAM check of its slots against their reserve (``reconciler.apply.serving``)."""
        return check_reserve(self.context, action, observed)

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
        t0 = self.io.clock.monotonic()
        self._settle_ownership()
        observed, first = start or self.plan_now()
        result = self._converge_from(observed, first, max_steps=max_steps, approved=approved)
        result.seconds = self.io.clock.monotonic() - t0
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
        with self.context.files_lock:
            if own.created is None:
                migrate_created(host, [c.id for c in containers if owner_kind(c, host, own) == "ours"])
            settle_created(host, [(c.id, c.name, c.label(LABEL_CREATE_TOKEN)) for c in containers])

    def _converge_from(
        self, observed: Observed, first: Plan, *, max_steps: int | None, approved: Plan | None = None
    ) -> PassResult:
        if first.apply_refusal is not None:
            return PassResult(
                "error", first, first, message=f"{unavailable_message(observed, first.unavailable)}; nothing changed"
            )
        if first.blocked and not first.actions:
            return PassResult("blocked", first, first, message="; ".join(b.reason for b in first.blockers))
        # Blockers are scoped to their slots (the planner plans nothing on a blocked slot): what they do not touch
        # runs, and the pass ends blocked.
        run = PassRun(
            first,
            observed,
            first,
            limit=max_steps if max_steps is not None else 2 * len(first.actions) + 6,
            approved=approved,
        )
        while run.todo() and len(run.outcomes) < run.limit:
            if self.cancel.is_set():
                return run.result("interrupted", "stop requested; nothing left half-owned")
            group = concurrent_group(tuple(run.todo()))
            if approved is not None:
                held = as_approved(run, approved, group)
                if isinstance(held, PassResult):
                    return held
                group = held
            stop = self._run_round(run, self._fitted(run, group))
            if stop is not None:
                # A superseded enter ends the pass too: what it was planned from is no longer wanted, and the next
                # pass plans the new desired state.
                return run.result("superseded" if stop.result == "superseded" else "interrupted", stop.detail)
            if run.current.unavailable:
                break
        return self._verdict(run)

    def _fitted(self, run: PassRun, group: list[Action]) -> list[Action]:
        """The group cut to the pass's step limit, and to its first action when together they do not fit the tmpfs
        (one at a time, each refused on its own)."""
        group = group[: max(1, run.limit - len(run.outcomes))]
        if not self._room_for(group, run.observed):
            group = group[:1]
        return group

    def _run_round(self, run: PassRun, group: list[Action]) -> Outcome | None:
        """Run one group, plan the host again, and record each outcome (its postcondition checked against the new
        plan). Returns the first interrupted or superseded outcome, if any: the pass ends there, unplanned again."""
        started = self.io.clock.monotonic()
        done = self._execute_group(group, run.observed)
        run.observed, run.current = self.plan_now(run.failed)
        done = [with_dark(a, o, run.dark_since, started) for a, o in zip(group, done, strict=True)]
        stop: Outcome | None = None
        for action, outcome in zip(group, done, strict=True):
            outcome = postcondition(action, outcome, run.current)
            run.outcomes.append(outcome)
            if self.on_outcome:
                self.on_outcome(outcome)
            if outcome.result in ("interrupted", "superseded"):
                stop = stop or outcome
            if outcome.result in ("failed", "refused"):
                run.failed[action.key] = f"{action.kind.value} failed in this pass: {outcome.detail}"
        if stop is not None:
            return stop
        # Planned again with the failures held, as the actions themselves reported them (a postcondition that failed
        # leaves the plan that found it).
        if any(o.result in ("failed", "refused") for o in done):
            run.observed, run.current = self.plan_now(run.failed)
        return None

    def _verdict(self, run: PassRun) -> PassResult:
        """How a pass that ran its rounds ended; a converged one records its topology (the loop's fallback)."""
        current = run.current
        bad = [o for o in run.outcomes if o.result in ("failed", "refused")]
        if bad:
            return run.result("failed", "; ".join(o.detail for o in bad))
        if current.unavailable:
            # the cause too, as before the first action: the operator reads why the pass stopped here
            return run.result("error", unavailable_message(run.observed, current.unavailable))
        if current.blocked:
            return run.result("blocked", run.with_kept("; ".join(b.reason for b in current.blockers)))
        if run.todo():
            return run.result("failed", f"did not converge after {len(run.outcomes)} actions")
        if current.held:
            return run.result("held", run.with_kept("; ".join(h.reason for h in current.held)))
        record_topology(self.desired.host.name, [(a.recipe, a.slots) for a in self.desired.assignments])
        return run.result("converged", run.with_kept(""))

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
            return self.io.run_group([functools.partial(self._execute, a, observed) for a in group])
        except GroupNotStarted as exc:
            # Those that ran have ended (their outcomes stand); those that never ran failed, saying why.
            return [
                o if o is not None else Outcome(a, "failed", 0.0, f"not started: {exc}")
                for a, o in zip(group, exc.results, strict=True)
            ]

    def _execute(self, action: Action, observed: Observed) -> Outcome:
        t0 = self.io.clock.monotonic()
        refusal = ""
        result: OutcomeResult
        self._announce(action)
        self.context.begin()
        try:
            if action.kind is ActionKind.ENTER:
                detail, freed = self.enter(action, observed)
            elif action.kind is ActionKind.LEAVE:
                detail, freed = self.leave(action, observed)
            elif action.kind is ActionKind.PRUNE:
                detail, freed = self.prune(action, observed)
            elif action.kind is ActionKind.SLEEP:
                detail, freed = self.sleep_lane(action, observed)
            elif action.kind is ActionKind.WAKE:
                detail, freed = self.wake_lane(action, observed)
            else:
                detail, freed = self.reclaim(action)
            result = "ok"
        except Cancelled as exc:
            detail, freed, result = str(exc), 0, "interrupted"
        except Superseded as exc:
            detail, freed, result = exc.cause, 0, "superseded"
        except ActionRefused as exc:
            detail, freed, result, refusal = exc.cause, 0, "refused", exc.reason
        except ActionFailed as exc:
            detail, freed, result = exc.cause, 0, "failed"
        except ReconcilerError as exc:
            detail, freed, result = str(exc), 0, "failed"
        except Exception as exc:  # noqa: BLE001 - a Docker API error etc.: the action failed, say why
            detail, freed, result = f"{type(exc).__name__}: {exc}", 0, "failed"
        seconds = self.io.clock.monotonic() - t0
        if result == "ok" and action.recipe and action.kind in _TIMED:
            with self.context.files_lock:
                record_duration(self.desired.host.name, action.recipe, action.kind.value, seconds)
        self.progress.done(action, result, seconds, detail)
        return Outcome(action, result, seconds, detail, freed, refusal, extra=dict(self.context.figures()))

    def reclaim(self, action: Action) -> tuple[str, int]:
        self.progress.phase(action, "two inspections", timeout=self.desired.host.shm.confirm_interval_s)
        res = self.context.guarded_reclaim(only_paths=list(action.paths))
        if res.refused:
            why = "offload_container_running" if res.blocking_containers else "source_unavailable"
            raise ActionRefused(f"reclaim refused: {res.refused}", reason=why)
        if res.errors:
            raise ActionFailed("reclaim failed: " + "; ".join(res.errors))
        if res.reclaimed and not res.verified:
            raise ActionFailed(f"reclaim could not verify that {len(res.reclaimed)} removed file(s) are gone")
        if not res.reclaimed and res.kept:
            raise ActionFailed("reclaim kept every file: " + "; ".join(f"{k.path}: {k.reason}" for k in res.kept))
        return f"reclaimed {len(res.reclaimed)} file(s), {human_bytes(res.reclaimed_bytes)}", int(res.reclaimed_bytes)

    def _announce(self, action: Action) -> None:
        """Tell the progress how long this recipe's earlier enters or leaves took (none for a reclaim)."""
        expect = getattr(self.progress, "expect", None)
        if expect is None or action.kind not in _TIMED or not action.recipe:
            return
        past = expected(self.desired.host.name, action.recipe, action.kind.value)
        expect(action, past[0] if past else None, past[1] if past else 0)


# The kinds whose earlier durations give the progress its expected time.
_TIMED = (ActionKind.ENTER, ActionKind.LEAVE, ActionKind.SLEEP, ActionKind.WAKE)
