"""The calls every front-end makes to a host: ``HostService``, for the host described under a root, and the hooks
by which a running loop counts the actions its own front-ends take (``ActionHooks``, in ``context``).

Made by the command line (``reconciler.cli.common``), the HTTP API, MCP and the loop's control socket, each with its
``Caller``. Read-only calls (plan, status, probe, shm status, audit) and destructive ones (shm reclaim, apply,
adopt, prune), the latter serialised with the loop (``exclusive``) and recorded in the audit trail. The service is
the facade only: what its calls share is one ``CallContext`` (``reconciler.service.context``), and each longer call
lives in a module of its own (``planning``, ``status``, ``probe``, ``shm``, ``reclaim``, ``apply_session``,
``adopt``, ``prune``, ``switch``, ``promote``, ``sync``, ``qualify``, ``evidence``) that takes that context, or the
part of it it uses, and never the service. Each is imported when its call is made: a light command such as
``audit`` then loads no observer, planner or apply layer, as before (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.base.requests import is_plan_id
from reconciler.plan.fingerprint import Fingerprint
from reconciler.service.caller import Caller
from reconciler.service.context import ActionHooks, CallContext
from reconciler.service.results import ApplyResult, AuditResult
from reconciler.service.saved_plans import read_plan_document, stored_plan_path
from reconciler.store.audit import audit_log

if TYPE_CHECKING:
    from reconciler.apply.host_io import HostIO
    from reconciler.apply.results import Progress
    from reconciler.model import DesiredState, HostConfig
    from reconciler.service.apply_session import ApplySession
    from reconciler.service.evidence import EvidenceResult
    from reconciler.service.promote import PromoteResult
    from reconciler.service.qualify import QualifyResult
    from reconciler.service.results import (
        AdoptResult,
        PlanResult,
        ProbeReport,
        PruneResult,
        ReclaimOutcome,
        StatusResult,
    )
    from reconciler.service.shm import ShmStatusResult
    from reconciler.service.switch import SwitchResult
    from reconciler.service.sync import SyncResult


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
        io: HostIO | None = None,
    ):
        # What every call hands the module that makes it (``CallContext``: the seams, the caller, the lock, the
        # hooks, the caller's files); the calls' modules never see the service itself.
        self.context = CallContext(root, caller, io=io, pass_lock=pass_lock, hooks=hooks, files=files)
        # The host the open apply session was made for: a refusal recorded after it (not approved) names it without
        # reading the host file again.
        self._host_name: str | None = None

    @property
    def root(self) -> str:
        return self.context.root

    @property
    def io(self) -> HostIO | None:
        """The host's I/O seams (None: the host's own, ``REAL_IO``, resolved by the calls that reach the host)."""
        return self.context.io

    @property
    def caller(self) -> Caller:
        return self.context.caller

    @property
    def pass_lock(self) -> contextlib.AbstractContextManager[object] | None:
        return self.context.pass_lock

    @property
    def hooks(self) -> ActionHooks | None:
        return self.context.hooks

    @property
    def files(self) -> Any:
        """The caller's files (``plan --out FILE``, ``apply FILE``) when the loop serves a command line for it."""
        return self.context.files

    # ------------------------------------------------------------ helpers

    def desired(self) -> DesiredState:
        return self.context.desired()

    def host(self) -> HostConfig:
        return self.context.host()

    def exclusive(self, host: str, command: str) -> contextlib.AbstractContextManager[None]:
        """Serialised with the loop: its pass lock in-process, or the host lock file."""
        return self.context.exclusive(host, command)

    def released(self) -> contextlib.AbstractContextManager[None]:
        """Inside ``exclusive``: the loop's pass lock given back for the block (a person deciding on a prompt), so
        the loop's passes go on meanwhile and what they change makes the plan stale; taken again after it. The host
        lock file of a stand-alone command stays held, as before."""
        return self.context.released()

    def record_refusal(self, action: str, reason: str, *, host: str | None = None) -> None:
        """An action this caller asked for and was refused before anything was done (the host lock held, no
        approval, a plan file not its own): in the audit trail with why. An audit that cannot be written does not
        hide the refusal itself."""
        self.context.record_refusal(action, reason, host=host or self._host_name)

    def record(self, action: str, **fields: Any) -> None:
        """One audit record of an action by this caller (for the host under ``root``)."""
        self.context.record(self._host_name or self.host().name, action, **fields)

    # ------------------------------------------------------------ read-only

    def plan(self, *, save: bool = False, out: str | None = None) -> PlanResult:
        """A dry run. ``save`` keeps it under the state dir and gives it a ``plan_id`` (for ``apply_saved``);
        ``out`` writes it to a file (``reconciler plan --out``). Either way with the fingerprint of its inputs."""
        from reconciler.service.planning import plan_host  # start-up: audit loads no observer, planner or apply layer

        return plan_host(self.context, save=save, out=out)

    def status(self) -> StatusResult:
        from reconciler.service.status import host_status  # start-up: audit loads no observer, planner or apply layer

        return host_status(self.context)

    def probe(self, recipe: str, *, suite: str = "preflight") -> ProbeReport:
        """Run one suite of a recipe's probes (``preflight``, ``regression`` or ``all``) against its running lane,
        now, sampling its cards' free VRAM meanwhile. Read-only for the host: nothing is started or stopped; the
        run goes to the audit trail and is kept as the suite's last run (``status``, the metrics)."""
        from reconciler.service.probe import run_probe  # start-up: audit loads no observer or probe's HTTP client

        return run_probe(self.context, recipe, suite=suite)

    def qualify(self, recipe: str, *, ladder: Any = None, reload: bool = False, repeat: int = 1) -> QualifyResult:
        """The report's qualification against the recipe's running, awake lane (refused otherwise): preflight, the
        context ladder, with ``reload`` the offload reload proof; kept as evidence (a failed run too) and audited.
        Read-only for the host: nothing is started, stopped or switched."""
        # start-up: audit loads no observer, NVML reader or lane's HTTP client
        from reconciler.service.qualify import DEFAULT_LADDER, run_qualify

        return run_qualify(self.context, recipe, ladder=ladder or DEFAULT_LADDER, reload=reload, repeat=repeat)

    def evidence(self, recipe: str | None = None) -> EvidenceResult:
        """The kept qualification records (of ``recipe``, or all), oldest first."""
        from reconciler.service.evidence import list_evidence  # start-up: audit loads no gates nor evidence store

        return list_evidence(self.desired(), recipe)

    def shm_status(self) -> ShmStatusResult:
        from reconciler.service.shm import shm_status  # start-up: audit loads no observer

        return shm_status(self.host())

    def audit(self, *, since: float | None = None) -> AuditResult:
        host = self.host().name
        return AuditResult(host, audit_log(host).read(since=since))

    # ------------------------------------------------------------ destructive

    def shm_reclaim(self, *, confirm: bool, paths: list[str] | None = None) -> ReclaimOutcome:
        """The guarded cleanup: a dry run unless ``confirm``; with ``paths``, nothing outside them is removed."""
        from reconciler.service.reclaim import shm_reclaim  # start-up: audit loads no observer or guard

        return shm_reclaim(self.context, confirm=confirm, paths=paths)

    @contextlib.contextmanager
    def apply_session(
        self, *, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> Iterator[ApplySession]:
        """Hold the host for one apply: observe and plan under the lock, then let the caller show, approve, run.

        The plan is made as ``plan`` makes it: with a running loop's view (the lanes it holds in backoff, the last
        converged topology its fallback serves), so an apply the loop serves (the command line over its socket, the
        HTTP API, MCP) neither enters a held lane nor takes its fallback down."""
        # start-up: audit loads no observer, planner or apply layer
        from reconciler.service.apply_session import open_session

        with open_session(self.context, progress=progress, cancel=cancel) as session:
            self._host_name = session.host
            yield session

    def switch(self, name: str) -> SwitchResult:
        """Set the manifest's running topology to ``name`` (its ``topology:`` value alone); the loop converges it."""
        from reconciler.service.switch import switch_topology  # start-up: audit loads no manifest editor

        return switch_topology(self.context, name)

    def promote(self, alias: str, recipe: str) -> PromoteResult:
        """Set the recipe ``alias`` names to ``recipe`` when its evidence passes every gate of the alias."""
        from reconciler.service.promote import promote_alias  # start-up: audit loads no gates nor manifest editor

        return promote_alias(self.context, alias, recipe)

    def sync(self) -> SyncResult:
        """Fetch the host's git source and take its newest commit when it validates and its canaries converged it
        (``source.after``); the loop converges what it holds."""
        from reconciler.service.sync import sync_source  # start-up: audit loads no git source nor fleet client

        res = sync_source(self.context)
        if res.taken and self.hooks is not None:
            self.hooks.wake("sync")
        return res

    def adopt(self, names: list[str]) -> AdoptResult:
        """Record containers that carry this host's labels but no install id as this install's (logged)."""
        from reconciler.service.adopt import adopt_containers  # start-up: audit loads no observer or apply layer

        return adopt_containers(self.context, names)

    def prune(self, *, confirm: bool) -> PruneResult:
        """The failed containers of this install kept for their logs: listed (a dry run), or with ``confirm``
        removed, all of them at once, each only while it is still stopped (logged in the audit trail)."""
        from reconciler.service.prune import prune_kept_failed  # start-up: audit loads no observer or apply layer

        return prune_kept_failed(self.context, confirm=confirm)

    def saved_plan(self, source: str) -> tuple[str, dict[str, Any], Fingerprint]:
        """A saved plan by its ``plan_id`` (from ``plan(save=True)``) or by file path."""
        if is_plan_id(source):
            path = stored_plan_path(self.host().name, source)
            doc, fp = read_plan_document(path)  # the host's own store, not the caller's file
        else:
            path = source
            doc, fp = read_plan_document(path, files=self.files)
        return path, doc, fp

    def apply_saved(
        self,
        source: str,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        shown: Callable[[Any, Any], None] | None = None,
    ) -> ApplyResult:
        """Apply exactly a saved plan, refused (``stale``, with what changed) when anything changed since. ``shown``
        (the command line's) is given the plan and its observation once it holds, before its first step runs."""
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
            if shown is not None:
                shown(s.plan, s.observed)
            return ApplyResult(host, passed=s.run(source=source))
