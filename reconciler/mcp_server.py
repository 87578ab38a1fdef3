"""The MCP server: the field report's controller tools over the service layer (``reconciler.service``).

Five tools, named as the report names them:

- ``host_status`` (read-only): what is on each GPU slot, containers, shm, converged or not (``status --json``);
- ``host_plan`` (read-only): the dry run, kept under the state dir with a ``plan_id`` for ``host_manage apply``
  (``plan --json``);
- ``host_shared_memory`` (read-only): the offload files and their owners (``shm status --json``);
- ``host_probe`` (read-only for the host): one suite of a recipe's functional probes against its running lane, its
  cards' free VRAM sampled meanwhile (``probe RECIPE --suite SUITE --json``);
- ``host_manage`` (destructive): ``reclaim-shared-memory`` (a dry run unless ``confirm``; ``shm reclaim --json``)
  or ``apply`` of a plan id from ``host_plan``, refused as stale when anything changed since (``apply --json``).

Each answer's structured content is exactly the command line's ``--json`` (redacted again on its way out); an
answer whose command would exit 1 (a refused reclaim, a stale plan, a source unavailable) is marked ``isError``.
``reconciler mcp`` serves it over stdio (no token: the client that starts the process owns it); ``reconciler run``
mounts the same server at ``/mcp`` on its listener behind the API's bearer token (``reconciler.api``). Like every
front-end it never observes, plans or acts on its own: each tool is one call of ``HostService``.
"""

# No ``from __future__ import annotations``: the SDK reads each tool's signature (its input schema) at runtime.
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.types import CallToolResult
from pydantic import Field

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from reconciler.service import HostService

PLAN_ID = re.compile(r"^[0-9a-f]{32}$")
RECIPE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# What each tool returns: its structured content is a JSON object (the command line's --json), published as such.
Json = Annotated[CallToolResult, dict[str, Any]]

READ_ONLY = {"read_only_hint": True, "destructive_hint": False, "idempotent_hint": True, "open_world_hint": False}
# A probe changes nothing on the host, but it is not idempotent for the lane: it sends it requests (a 128K prompt,
# twenty at once) that take its time and memory.
PROBE = {"read_only_hint": True, "destructive_hint": False, "idempotent_hint": False, "open_world_hint": False}
DESTRUCTIVE = {"read_only_hint": False, "destructive_hint": True, "idempotent_hint": False, "open_world_hint": False}

INSTRUCTIONS = (
    "Tools of a GPU serving host run by a declarative reconciler. Read with host_status, host_plan and "
    "host_shared_memory; host_probe runs a recipe's probe suite (preflight or regression) against its lane. host_manage changes the host: action 'reclaim-shared-memory' is a dry run unless "
    "confirm is true (it lists exactly what a confirmed call removes, and removes only orphan offload files, never "
    "while a native-offload container runs); action 'apply' carries out a plan made by host_plan, named by its "
    "plan_id, and is refused when anything changed since that plan was made."
)


def tool_result(data: dict[str, Any], exit_code: int) -> CallToolResult:
    """The ``CallToolResult`` of one service answer: ``data`` (redacted) as structured content and as JSON text."""
    from mcp.types import TextContent

    from reconciler.redact import redact_data, redact_json

    data = redact_data(data)
    return CallToolResult(
        content=[TextContent(type="text", text=redact_json(data, indent=2))],
        structured_content=data,
        is_error=exit_code == 1,
    )


def _call(fn: Callable[[], Any]) -> Any:
    """Run one service call; its ``ReconcilerError`` becomes the tool's error text (never a traceback)."""
    from mcp.server.mcpserver.exceptions import ToolError

    from reconciler.errors import ConfigError, ReconcilerError
    from reconciler.redact import redact_text

    try:
        res = fn()
    except ConfigError as exc:
        raise ToolError("invalid configuration: " + "; ".join(redact_text(str(p)) for p in exc.problems)) from None
    except ReconcilerError as exc:
        raise ToolError(redact_text(str(exc))) from None
    return tool_result(res.to_json(), res.exit_code)


def build_server(service: "Callable[[], HostService]", *, name: str = "reconciler") -> "MCPServer":
    """The MCP server over ``service()`` (a fresh ``HostService`` per call, naming the caller for the audit)."""
    from mcp.server import MCPServer
    from mcp.types import ToolAnnotations

    from reconciler import __version__

    server = MCPServer(name, version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(
        name="host_status",
        title="Host status",
        description="What is on each GPU slot, the containers, the offload shm, converged or not: the same JSON as "
        "`reconciler status --json`. Read-only.",
        annotations=ToolAnnotations(title="Host status", **READ_ONLY),
    )
    def host_status() -> Json:
        return _call(lambda: service().status())

    @server.tool(
        name="host_plan",
        title="Plan (dry run)",
        description="What the reconciler would change and why, changing nothing: the same JSON as "
        "`reconciler plan --json`. With save (the default) the plan is kept on the host for a day and its "
        "'plan_id' is what host_manage's 'apply' carries out. Read-only for the host.",
        annotations=ToolAnnotations(title="Plan (dry run)", **READ_ONLY),
    )
    def host_plan(
        save: Annotated[bool, Field(description="keep the plan and return its plan_id for host_manage apply")] = True,
    ) -> Json:
        return _call(lambda: service().plan(save=save))

    @server.tool(
        name="host_shared_memory",
        title="Shared memory (offload files)",
        description="The offload files in the host's shm dir, their size, who maps or holds each (pid, container) "
        "and whether it is owned, an orphan or blocked: the same JSON as `reconciler shm status --json`. Read-only.",
        annotations=ToolAnnotations(title="Shared memory (offload files)", **READ_ONLY),
    )
    def host_shared_memory() -> Json:
        return _call(lambda: service().shm_status())

    @server.tool(
        name="host_probe",
        title="Probe a lane",
        description="Run one suite of a recipe's functional probes against its running lane, now: 'preflight' (what "
        "every enter runs: smoke, structured JSON, 8K retrieval, tools, streaming tools, tool-result continuation, "
        "Responses) or 'regression' (on demand: a ~128K needle, a 20-request shared-prefix tool batch, ...), or "
        "'all'. Each probe's result and what came back, and the free VRAM of the lane's cards at their lowest "
        "meanwhile, with the probe that ran then: the same JSON as `reconciler probe RECIPE --suite SUITE --json`. "
        "Starts and stops nothing; the run is written to the audit trail.",
        annotations=ToolAnnotations(title="Probe a lane", **PROBE),
    )
    def host_probe(
        recipe: Annotated[str, Field(pattern=RECIPE_NAME.pattern, max_length=128,
                                     description="the recipe's name (its file stem under configs/recipes/)")],
        suite: Annotated[Literal["preflight", "regression", "all"],
                         Field(description="which probes: preflight, regression, or all")] = "preflight",
    ) -> Json:
        return _call(lambda: service().probe(recipe, suite=suite))

    @server.tool(
        name="host_manage",
        title="Manage the host",
        description="Change the host, guarded exactly as the command line is. action 'reclaim-shared-memory': the "
        "guarded cleanup of orphan offload files, a dry run unless confirm is true (the same JSON as `reconciler shm "
        "reclaim --json`; refused while a native-offload container runs or a source cannot be read); 'paths' limits "
        "a confirmed reclaim to files a dry run listed. action 'apply': carry out the plan host_plan saved, named by "
        "plan_id; refused as stale, with what changed, when the host or its files changed since. Every call that "
        "changes something is written to the host's audit trail.",
        annotations=ToolAnnotations(title="Manage the host", **DESTRUCTIVE),
    )
    def host_manage(
        action: Annotated[
            Literal["reclaim-shared-memory", "apply"],
            Field(description="'reclaim-shared-memory' (dry run unless confirm) or 'apply' (needs plan_id)"),
        ],
        confirm: Annotated[bool, Field(description="reclaim-shared-memory: actually remove the orphans")] = False,
        plan_id: Annotated[
            str | None,
            Field(pattern=PLAN_ID.pattern, description="apply: the plan_id host_plan returned (32 hex digits)"),
        ] = None,
        paths: Annotated[
            list[str] | None,
            Field(description="reclaim-shared-memory: remove nothing but these paths (from a dry run)"),
        ] = None,
    ) -> Json:
        from mcp.server.mcpserver.exceptions import ToolError

        if action == "reclaim-shared-memory":
            if plan_id is not None:
                raise ToolError("plan_id is for action 'apply'; reclaim-shared-memory takes confirm (and paths)")
            return _call(lambda: service().shm_reclaim(confirm=confirm, paths=paths))
        if not plan_id:
            raise ToolError("action 'apply' needs the plan_id of a plan made by host_plan (call host_plan first)")
        if paths:
            raise ToolError("paths is for action 'reclaim-shared-memory'")
        return _call(lambda: service().apply_saved(plan_id))

    return server


def serve_stdio(root: str) -> int:
    """``reconciler mcp``: the server over stdin/stdout until the client closes it. Destructive calls take the host
    lock file, so they are refused while a loop (``reconciler run``) holds it: use its ``/mcp`` then."""
    from reconciler.service import Caller, HostService

    server = build_server(lambda: HostService(root, caller=Caller("mcp", "stdio")))
    server.run("stdio")
    return 0
