"""``reconciler run``: the level-triggered loop (``Loop``); its parts are the modules beside it (``log``,
``triggers``, ``hosting``, ``refusals``, ``runtime``, ``backoff``, ``failures``: what a lane's failures do to its
backoff, ``changes``: what outlives a pass, logged once, ``metrics``, ``pass_labels``, ``progress``, ``source``: the
git source's fetches).

Triggers only say "look again": a change under manifests/ or configs/ (watchdog, debounced so an editor's
save-rename-save is one trigger), a Docker event of a container (start, die, destroy), SIGHUP, a backoff that
expires, and the resync timer. Every cycle re-reads everything and runs the same plan/apply as ``reconciler apply``.
An invalid edit never tears anything down: the loop keeps the last valid desired state and exports the error.
Hosts the front-ends it is handed (``reconciler.loop.hosting``): the one listener serving ``/metrics``,
``/healthz``, the HTTP API (``/v1``) and MCP (``/mcp``), and the socket on which it answers the command line; a
destructive call from those takes the pass lock, so it never runs during a pass. Holds the host lock for its whole
life. Built, with its front-ends, by ``reconciler.cli.commands.run``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
from collections.abc import Sequence
from typing import Any

from reconciler import __version__
from reconciler.apply.applier import Applier
from reconciler.apply.host_io import REAL_IO, HostIO
from reconciler.apply.results import Outcome, PassResult
from reconciler.base import sdnotify
from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.base.redact import redact_data
from reconciler.load.desired import load_desired
from reconciler.load.host_file import load_host
from reconciler.loop.backoff import Backoff
from reconciler.loop.changes import PassChanges
from reconciler.loop.failures import LaneFailures
from reconciler.loop.health import health_answer
from reconciler.loop.hosting import FrontEnd, FrontEndStates, Hosting
from reconciler.loop.log import Log
from reconciler.loop.metrics import Metrics
from reconciler.loop.pass_labels import pass_label
from reconciler.loop.progress import LogProgress
from reconciler.loop.refusals import pass_refusals, reclaim_refusals
from reconciler.loop.runtime import FairLock
from reconciler.loop.source import SourceFollower
from reconciler.loop.still_wanted import StillWanted
from reconciler.loop.triggers import EngineEvents, Triggers, watch_files
from reconciler.model import ApiConfig, DesiredState, assignment_key
from reconciler.observe.containers import EngineObserver
from reconciler.plan.verdict import action_label
from reconciler.store.audit import audit_log
from reconciler.store.history import last_topology
from reconciler.store.lock import HostLock
from reconciler.store.loop_state import clear_loop_state, state_path, write_loop_state


class Loop:
    """The loop of one root: ``run`` until a signal; ``front_ends`` are the servers it hosts while it runs."""

    def __init__(
        self,
        root: str,
        *,
        resync_s: float = 60.0,
        debounce_s: float = 0.1,
        log: Log | None = None,
        backoff: Backoff | None = None,
        front_ends: Sequence[FrontEnd] = (),
        io: HostIO | None = None,
    ):
        """``io``: the host's I/O seams (``REAL_IO``; the simulation's world), handed to each pass's applier, the
        loader's tmpfs reads and the lanes' readings."""
        self.root = root
        self.io = io or REAL_IO
        self.front_ends = tuple(front_ends)
        self.resync_s = resync_s
        self.debounce_s = debounce_s
        self.log = log or Log()
        self.backoff = backoff or Backoff()
        self.metrics = Metrics()
        self.changes = PassChanges(log=self.log, metrics=self.metrics)
        self.failures = LaneFailures(self.backoff, log=self.log, metrics=self.metrics, clock=self.io.clock)
        self.triggers = Triggers()
        self.source = SourceFollower(root, log=self.log, metrics=self.metrics, clock=self.io.clock)
        self.stop = threading.Event()
        self.cancel = threading.Event()
        self.desired: DesiredState | None = None
        self.observer: EngineObserver | None = None
        self.last_pass_at = 0.0
        self.files_valid: bool | None = None  # whether the files loaded at the last look (None: not read yet)
        self.last_pass: dict[str, Any] = {}
        self.passes = 0
        self._serving: list[FrontEnd] = []  # the front-ends started, in their order
        self.front_states = FrontEndStates()  # what they published of themselves (the listener bound or not)
        self._state_lock = threading.Lock()
        self.exit_code = 0  # 1 when the loop gives up on a front-end (its listener)
        self._pass_since: float | None = None  # monotonic start of the pass running now (the watchdog's view)
        # Held for each pass; a destructive call of the API or MCP takes it too, so the two never interleave (first
        # come, first served: a call that waits for a pass runs before the next one).
        self.pass_lock = FairLock()
        self._held: set[str] = set()  # assignments whose enter the last pass held: wake when their backoff ends
        self._acting: list[str] = []  # the actions of the pass running now ("kind recipe@slots"), published

    # ------------------------------------------------------------ lifecycle

    def run(self) -> int:
        if self.source.needs_first():
            # A git source of which no commit is in use yet: fetched first, under the host lock, until one is taken
            # (its canaries may not have converged it yet): there is nothing to load before.
            with HostLock(load_host(self.root, self.io.tmpfs).name, command="run"):
                while not self.source.follow({"sync"}) and self.source.needs_first():
                    self.stop.wait(self.source.interval_s or 5.0)
        desired = self._load()
        if desired is None:
            self.log("exit", reason="no valid desired state to start from; fix the files above")
            return 1
        with HostLock(desired.host.name, command="run"):
            self._install_signals()
            self._start_front_ends(desired.host.name, desired.host.api)
            watcher = watch_files(self.root, self.triggers)
            EngineEvents(
                triggers=self.triggers,
                log=self.log,
                stop=self.stop,
                observer=lambda: self.observer,
                scope=self._event_scope,
                engine_down=lambda: "docker" in self.changes.down,
            ).start()
            self.log("start", host=desired.host.name, root=self.root, resync_s=self.resync_s, version=__version__)
            self.triggers.fire("start")
            sdnotify.start_watchdog(self._well, self.stop)
            try:
                while not self.stop.is_set():
                    self._wait()
                    if self.stop.is_set():
                        break
                    reasons, _ = self.triggers.take()
                    try:
                        with self.pass_lock:
                            self._pass_since = self.io.clock.monotonic()
                            self.cycle(reasons or {"resync"})
                    except Exception as exc:  # noqa: BLE001 - one bad pass must not end the loop: log it, go on
                        self.log("pass-error", error=f"{type(exc).__name__}: {exc}")
                        self.metrics.record_pass("error", 0.0)
                        if self.desired is not None:
                            self._write_state(self.desired)  # no pass is acting any more
                    finally:
                        self._pass_since = None
                    if self.passes <= 1:
                        sdnotify.notify("READY=1")  # the first pass is done: the host has been looked at
            finally:
                sdnotify.notify("STOPPING=1")
                watcher.stop()
                self._close_front_ends()
                clear_loop_state(desired.host.name)
                self.log("exit", reason="signal" if not self.exit_code else "listener", passes=self.passes)
        return self.exit_code

    def _start_front_ends(self, host: str, api: ApiConfig | None = None) -> None:
        """Start each front-end in its order; one that cannot start closes those started before it, and its error
        ends the loop before its first pass."""
        hosting = Hosting(
            root=self.root,
            host=host,
            log=self.log,
            metrics=self.metrics,
            pass_lock=self.pass_lock,
            cancel=self.cancel,
            health=self.health,
            on_outcome=self._count_outcome,
            on_reclaim=self._on_reclaim,
            on_shm_reclaim=self._count_shm_reclaim,
            fatal=self._listener_lost,
            wake=self.triggers.fire,
            publish=self._publish,
            api=api,
        )
        try:
            for front in self.front_ends:
                front.start(hosting)
                self._serving.append(front)
        except BaseException:
            self._close_front_ends()
            raise

    def _close_front_ends(self) -> None:
        """Close the front-ends started, in reverse order."""
        while self._serving:
            self._serving.pop().close()

    def _well(self) -> bool:
        """For the systemd watchdog: every front-end serves and no pass has run longer than any pass can (every
        recipe's start and stop timeouts, three times over, and ten minutes)."""
        if not all(front.alive() for front in self._serving):
            return False
        since = self._pass_since
        if since is None or self.desired is None:
            return True
        limit = 600.0 + 3 * sum(r.health.start_timeout_s + r.stop.timeout_s for r in self.desired.recipes.values())
        return self.io.clock.monotonic() - since < limit

    def _publish(self, name: str, state: dict[str, Any]) -> None:
        """A front-end's own state (the listener bound, or why not): systemd's STATUS and the loop's state now."""
        sdnotify.notify("STATUS=" + self.front_states.set(name, state))
        if self.desired is not None:
            # A pass changing the backoff while it is read here writes the state itself next.
            with contextlib.suppress(RuntimeError):
                self._write_state(self.desired)

    def _listener_lost(self, why: str) -> None:
        """The listener died too often to go on restarting it: end the loop with exit 1 (systemd restarts it)."""
        self.exit_code = 1
        self.stop.set()
        self.triggers.wake.set()

    def _install_signals(self) -> None:
        # A handler runs in the main thread between two bytecodes, possibly while that thread holds the log's or
        # the triggers' lock: taking either lock in the handler would deadlock the loop. The handler only queues
        # the signal (SimpleQueue.put is reentrant); a relay thread acts on it.
        received: queue.SimpleQueue[int] = queue.SimpleQueue()

        def relay() -> None:
            while True:
                signum = received.get()
                if signum == signal.SIGHUP:
                    self.triggers.fire("sighup")
                    continue
                self.log(
                    "signal", signal=signal.Signals(signum).name, action="finish or abandon the current action safely"
                )
                self.stop.set()
                self.cancel.set()
                self.triggers.wake.set()

        threading.Thread(target=relay, name="signals", daemon=True).start()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda n, _f: received.put(n))

    def _wait(self) -> None:
        """Sleep until a trigger, the resync timer or the next backoff expiry; debounce file events."""
        timeout = self.resync_s
        now = self.io.clock.time()
        pending = [e.until for e in self.backoff.entries.values() if e.until > now]
        # An enter the last pass held whose backoff ran out while that pass was still running: try it now, not
        # at the next resync.
        pending += [now for k in self._held if (e := self.backoff.entries.get(k)) is not None and e.until <= now]
        nxt = min(pending, default=None)
        if nxt is not None:
            timeout = min(timeout, max(0.05, nxt - self.io.clock.time() + 0.05))
        fetch = self.source.due_in()
        if fetch is not None:
            timeout = min(timeout, fetch + 0.05)
        if not self.triggers.wake.wait(timeout):
            due = self.source.due_in()
            self.triggers.fire("sync" if due == 0.0 else "resync" if nxt is None else "backoff")
        while not self.stop.is_set():
            with self.triggers.lock:
                quiet = self.io.clock.monotonic() - self.triggers.fs_at
            if "file" not in self.triggers.reasons or quiet >= self.debounce_s:
                return
            self.stop.wait(self.debounce_s - quiet)  # a stop ends the wait: SIGTERM never waits out a debounce

    # ------------------------------------------------------------ one cycle

    def _load(self) -> DesiredState | None:
        try:
            desired = load_desired(self.root, tmpfs=self.io.tmpfs)
        except ConfigError as exc:
            for p in exc.problems:
                self.log("config-invalid", path=p.path, line=p.line, error=p.message)
            self.metrics.set_manifest_valid(False, str(exc.problems[0]) if exc.problems else "invalid")
            self.files_valid = False
            if self.desired is not None:
                self.log("config-kept", reason="keeping the last valid desired state; nothing is torn down")
            return self.desired
        if self.desired is None or desired != self.desired:
            self.log(
                "config-loaded",
                host=desired.host.name,
                manifest=desired.manifest_path,
                assignments=",".join(a.key for a in desired.assignments) or "none",
                **({"commit": desired.source_commit[:12]} if desired.source_commit else {}),
            )
        self.metrics.set_manifest_valid(True)
        self.files_valid = True
        self.metrics.configure(host=desired.host, recipes=desired.recipes)
        if self.observer is None or (self.observer.url, self.observer.timeout) != (
            desired.host.docker.url,
            desired.host.docker.timeout_s,
        ):
            self.observer = self.io.engine(desired.host)
        self.desired = desired
        return desired

    def cycle(self, reasons: set[str]) -> PassResult | None:
        t0 = self.io.clock.monotonic()
        self._held = set()
        self.source.follow(reasons)  # a commit taken is what _load reads now
        edits = self.triggers.file_events  # read before the load: an edit in between is judged again, never missed
        desired = self._load()
        if desired is None:
            self.metrics.record_pass("error", self.io.clock.monotonic() - t0)
            return None
        self.failures.forget_edited(desired)
        try:
            # connect=False: an engine that does not answer is a source down in this pass's observation (logged,
            # exported, /healthz 503), and the loop waits for it; it never ends the loop.
            applier = Applier(
                desired,
                observer=self.observer,
                cancel=self.cancel,
                hold=self.backoff.holds(),
                on_outcome=self._on_outcome,
                on_reclaim=self._on_reclaim,
                connect=False,
                progress=LogProgress(self.log),
                io=self.io,
            )
            applier.fallback_view = lambda: self._fallback_view(desired)
            applier.superseded = StillWanted(self.root, desired, self.triggers, edits, io=self.io)
            observed, plan = applier.plan_now()
            self.changes.sources(observed)
            if self.failures.crashes(desired, plan):
                # Counted before its leave runs, so the re-enter planned in this very pass waits for its backoff.
                applier.hold = self.backoff.holds()
                plan = applier.plan_of(observed)
        except Exception as exc:  # noqa: BLE001 - the loop must survive anything one pass throws
            self.log("pass-error", error=f"{type(exc).__name__}: {exc}")
            self.metrics.record_pass("error", self.io.clock.monotonic() - t0)
            return None
        self.metrics.observe_state(observed, plan)  # free VRAM per slot against its reserve, every pass
        self.changes.reserve(desired, observed)
        self.failures.settle(desired, plan)
        if plan.actions and not plan.unavailable:
            self.log("pass-start", trigger=",".join(sorted(reasons)), actions=len(plan.actions))
            for a in plan.actions:
                self.log("action-planned", kind=a.kind.value, target=a.key, reason=a.reason)
            # Published before the first action: every view says converging until this pass ends (the verdict).
            self._acting = [action_label(a.kind.value, a.recipe, a.gpus, a.container) for a in plan.actions]
            self._write_state(desired)
            try:
                result = applier.converge(start=(observed, plan))
                after, final = applier.plan_now()
                self.metrics.observe_state(after, final)
                self.metrics.observe_lanes(self.io.lanes.readings(desired, after).values())
            finally:
                self._acting = []
        else:
            result = applier.converge(start=(observed, plan))  # no actions: classifies only, changes nothing
            self.metrics.observe_lanes(self.io.lanes.readings(desired, observed).values())
        self._held = {assignment_key(h.recipe, h.gpus) for h in result.final.held}
        self.changes.fallbacks_after(result.final)
        for reason in pass_refusals(result):
            self.metrics.record_refusal(reason)
        kind = pass_label(result)
        seconds = self.io.clock.monotonic() - t0
        self.metrics.record_pass(kind, seconds)
        if result.outcomes or kind != "converged" or "start" in reasons:
            self.log(
                "pass",
                result=result.result,
                trigger=",".join(sorted(reasons)),
                seconds=round(seconds, 3),
                message=result.message or "-",
            )
        self.last_pass_at = self.io.clock.time()
        self.last_pass = {
            "result": result.result,
            "message": result.message,
            "at": self.last_pass_at,
            "unavailable": dict(self.changes.down),
            # The named topology the pass was made under (None: the manifest names none): the front door tells by it
            # which topology a blocked or an unblocked pass speaks for, whatever the manifest says by its next look.
            "topology": desired.topology,
        }
        # The state with this pass ended (no action in flight) is written before /healthz counts the pass: a view
        # that sees the new count never reads the old state (the verdict's samples tell a pass's end by the count).
        self._write_state(desired, passes=self.passes + 1)
        self.passes += 1
        return result

    def _fallback_view(self, desired: DesiredState) -> tuple[Any, dict[str, float]]:
        """For the planner: the last converged topology, and the seconds to each held assignment's next attempt."""
        now = self.io.clock.time()
        return last_topology(desired.host.name), {k: max(0.0, e.until - now) for k, e in self.backoff.entries.items()}

    def _count_outcome(self, o: Outcome) -> None:
        """One action's metrics, whoever took it: this loop, or its HTTP API or MCP (``ActionHooks``)."""
        self.metrics.record_outcome(o)

    def _count_shm_reclaim(self, res: Any) -> None:
        """A confirmed ``shm reclaim`` through the HTTP API or MCP: its refusals and the bytes it freed."""
        self._on_reclaim(res)
        if res.reclaimed_bytes:
            self.metrics.record_reclaim(int(res.reclaimed_bytes))

    def _on_outcome(self, o: Outcome) -> None:
        a = o.action
        self.log(
            "action",
            kind=a.kind.value,
            target=a.key,
            result=o.result,
            seconds=round(o.seconds, 3),
            reason=a.reason,
            detail=o.detail,
        )
        self._count_outcome(o)
        if self.desired is not None:
            # The loop's own actions go to the audit trail too, beside those of the front-ends.
            try:
                audit_log(self.desired.host.name).append(
                    {
                        "front": "loop",
                        "who": "",
                        "action": a.kind.value,
                        "target": a.key,
                        "outcome": o.result,
                        "reason": a.reason,
                        "detail": o.detail,
                        "bytes_freed": o.reclaimed_bytes,
                        "seconds": round(o.seconds, 3),
                        **o.extra,
                    }
                )
            except ReconcilerError as exc:
                self.log("audit-error", error=str(exc))
        self.failures.outcome(o)

    def _on_reclaim(self, res: Any) -> None:
        for reason in reclaim_refusals(res):
            self.metrics.record_refusal(reason)
            self.log(
                "refusal",
                reason=reason,
                refused=res.refused or "-",
                kept=";".join(f"{k.path}: {k.reason}" for k in res.kept if k.state != "owned") or "-",
            )

    def _write_state(self, desired: DesiredState, *, passes: int | None = None) -> None:
        # The desired state the loop acts on: after an invalid edit the last valid one, which `status` then shows
        # beside the files' error (the operator sees what the loop keeps doing, not only that the files are bad).
        # Under a lock: the pass writes it, and so does a front-end publishing its state from its own thread.
        with self._state_lock:
            kept = {
                "manifest": desired.manifest_path,
                "assignments": [{"recipe": a.recipe, "gpus": list(a.slots)} for a in desired.assignments],
            }
            data = {
                "pid": os.getpid(),
                "host": desired.host.name,
                "backoff": self.backoff.to_json(),
                "fallbacks": self.changes.fallback_json,
                "desired": kept,
                "last_pass": self.last_pass,
                "passes": self.passes if passes is None else passes,
                # The pass running now, while it acts: its actions (the verdict is converging until it ends).
                "pass": {"actions": list(self._acting)} if self._acting else None,
                **self.front_states.to_json(),
            }
            try:
                write_loop_state(desired.host.name, redact_data(data))  # failed-enter details quote container logs
            except (OSError, ReconcilerError) as exc:
                self.log("state-write-failed", path=str(state_path(desired.host.name)), error=str(exc))

    # ------------------------------------------------------------ triggers

    def _event_scope(self) -> tuple[str, frozenset[str] | None] | None:
        """For the event filter: this host's name and its slots' GPU indexes (None: a slot known by UUID only)."""
        desired = self.desired
        if desired is None:
            return None
        gpus = desired.host.gpus.values()
        if any(g.index is None for g in gpus):
            return desired.host.name, None
        return desired.host.name, frozenset(str(g.index) for g in gpus)

    # ------------------------------------------------------------ health

    def health(self) -> tuple[int, dict[str, Any]]:
        """``/healthz`` (``reconciler.loop.health``)."""
        return health_answer(
            age=self.io.clock.time() - self.last_pass_at if self.last_pass_at else None,
            resync_s=self.resync_s,
            down_codes=self.changes.down_codes,
            last=self.last_pass,
            files_valid=self.files_valid,
            passes=self.passes,
        )
