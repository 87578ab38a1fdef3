"""The service layer: what every front-end can do to a host, as typed calls returning typed results.

The command line (``reconciler.cli*``), the HTTP API (``reconciler.api``) and the MCP server
(``reconciler.mcp_server``) are thin front-ends over this package and never over each other: none of them observes,
plans or acts on its own. Each result's ``to_json()`` is exactly what ``--json`` prints, and its ``exit_code`` is
the command line's. Destructive calls (a confirmed reclaim, an apply) are serialised with the loop (its pass lock
when the loop serves the call in-process, else the host lock file, refused while a loop holds it) and leave a
record in the audit trail (``reconciler.store.audit``) naming the caller.

This module is the package's one facade: the front-ends import the service from here (``HostService``, the
``Caller`` they make, the results the calls return). The parts live in their own modules: ``host_service`` (the
calls), ``context`` (what the calls share: ``CallContext``, and the hooks of a loop), ``results``, ``caller``,
``saved_plans``; each longer call in a module of its own, which ``HostService`` imports when the call is made (so
that a light command such as ``audit`` loads no observer, planner or apply layer) and hands its ``CallContext``, or
the part of it the call uses, never itself: ``planning``, ``status``, ``probe``, ``shm``, ``reclaim``,
``apply_session``, ``adopt``, ``prune``, ``switch`` and ``promote`` (one manifest edit, ``manifest_edit``), ``sync``,
``qualify``, ``evidence``, with ``loop_view`` (a running loop's view, which they plan with).
"""

from reconciler.service.caller import SINCE_HELP, Caller, parse_since, user_caller
from reconciler.service.context import ActionHooks
from reconciler.service.host_service import HostService
from reconciler.service.results import (
    AdoptResult,
    ApplyResult,
    AuditResult,
    PlanResult,
    ProbeReport,
    PruneResult,
    ReclaimOutcome,
    StatusResult,
)

__all__ = [
    "SINCE_HELP",
    "ActionHooks",
    "AdoptResult",
    "ApplyResult",
    "AuditResult",
    "Caller",
    "HostService",
    "PlanResult",
    "ProbeReport",
    "PruneResult",
    "ReclaimOutcome",
    "StatusResult",
    "parse_since",
    "user_caller",
]
