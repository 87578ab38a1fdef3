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
import json
import re
import sys
from collections.abc import Callable
from io import TextIOWrapper
from typing import Annotated, Any, Literal

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reconciler import __version__
from reconciler.base import jsonstrict
from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.base.redact import redact_data, redact_json, redact_text
from reconciler.base.requests import (
    ALIAS_PATTERN,
    DEFAULT_SUITE,
    MAX_RECLAIM_PATHS,
    PLAN_ID_PATTERN,
    RECIPE_PATTERN,
    TOPOLOGY_PATTERN,
    ProbeSuite,
)
from reconciler.service import Caller, HostService

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
    "host_shared_memory; host_probe runs a recipe's probe suite (preflight or regression) against its lane. "
    "host_manage changes the host: action 'reclaim-shared-memory' is a dry run unless "
    "confirm is true (it lists exactly what a confirmed call removes, and removes only orphan offload files, never "
    "while a native-offload container runs); action 'apply' carries out a plan made by host_plan, named by its "
    "plan_id, and is refused when anything changed since that plan was made; action 'switch' sets the running "
    "topology, which the loop converges; action 'promote' moves an alias to a recipe whose evidence passes the "
    "alias's gates."
)


def tool_result(data: dict[str, Any], exit_code: int) -> CallToolResult:
    """The ``CallToolResult`` of one service answer: ``data`` (redacted) as structured content and as JSON text."""
    data = redact_data(data)
    return CallToolResult(
        content=[TextContent(type="text", text=redact_json(data, indent=2))],
        structured_content=data,
        is_error=exit_code == 1,
    )


def _call(fn: Callable[[], Any]) -> Any:
    """Run one service call; its ``ReconcilerError`` becomes the tool's error text (never a traceback)."""
    try:
        res = fn()
    except ConfigError as exc:
        raise ToolError("invalid configuration: " + "; ".join(redact_text(str(p)) for p in exc.problems)) from None
    except ReconcilerError as exc:
        raise ToolError(redact_text(str(exc))) from None
    return tool_result(res.to_json(), res.exit_code)


# ---------------------------------------------------------------- the tools' arguments, validated strictly


class _Args(BaseModel):
    # Strict: a confirmation is JSON true and nothing else ("yes", "true", 1 and 1.0 are refused, as the schema
    # says boolean), and an argument the tool does not take is refused rather than ignored.
    model_config = ConfigDict(extra="forbid", strict=True)


class NoArgs(_Args):
    pass


class PlanArgs(_Args):
    save: bool = Field(True, description="keep the plan and return its plan_id for host_manage apply")


class ProbeArgs(_Args):
    recipe: str = Field(
        pattern=RECIPE_NAME.pattern,
        max_length=128,
        description="the recipe's name (its file stem under configs/recipes/)",
    )
    suite: ProbeSuite = Field(DEFAULT_SUITE, description="which probes: preflight, regression, or all")


class ManageArgs(_Args):
    action: Literal["reclaim-shared-memory", "apply", "switch", "promote", "sync"] = Field(
        description="'reclaim-shared-memory' (dry run unless confirm), 'apply' (needs plan_id), 'switch' (needs "
        "topology), 'promote' (needs alias and recipe) or 'sync' (fetch the host's git source now)"
    )
    alias: str | None = Field(
        None, pattern=ALIAS_PATTERN, description="promote: the alias to move, a name under the manifest's aliases:"
    )
    recipe: str | None = Field(
        None, pattern=RECIPE_PATTERN, description="promote: the recipe the alias is to name (its evidence gated)"
    )
    topology: str | None = Field(
        None,
        pattern=TOPOLOGY_PATTERN,
        description="switch: the topology to run, a name under the manifest's topologies: (the loop converges it)",
    )
    confirm: bool = Field(False, description="reclaim-shared-memory: actually remove the orphans (JSON true)")
    plan_id: str | None = Field(
        None, pattern=PLAN_ID_PATTERN, description="apply: the plan_id host_plan returned (32 hex digits)"
    )
    paths: list[str] | None = Field(
        None,
        max_length=MAX_RECLAIM_PATHS,
        description="reclaim-shared-memory: remove nothing but these paths (from a dry run)",
    )


def _manage_problem(args: ManageArgs) -> str:
    """What host_manage's arguments lack or carry that their action does not take ("" when they are right)."""
    if args.action == "reclaim-shared-memory" and args.plan_id is not None:
        return "plan_id is for action 'apply'; reclaim-shared-memory takes confirm (and paths)"
    if args.action == "apply" and not args.plan_id:
        return "action 'apply' needs the plan_id of a plan made by host_plan (call host_plan first)"
    if args.action != "reclaim-shared-memory" and (args.paths or args.confirm):
        return "paths and confirm are for action 'reclaim-shared-memory'"
    if (args.action == "switch") != (args.topology is not None):
        return "action 'switch' needs topology (and only it takes one)"
    if (args.action == "promote") != (args.alias is not None) or (args.alias is None) != (args.recipe is None):
        return "action 'promote' needs alias and recipe (and only it takes them)"
    if args.action in ("switch", "promote", "sync") and args.plan_id is not None:
        return "plan_id is for action 'apply'"
    return ""


REFUSED_KEY = "__refused__"  # put in a call's arguments by the stdio reader when the line itself was refused


def _problem(model: type[BaseModel], e: Any) -> str:
    loc = ".".join(str(x) for x in e["loc"]) or "arguments"
    if e["type"] == "extra_forbidden":
        return f"unknown argument {loc!r} (this tool takes: {', '.join(model.model_fields) or 'nothing'})"
    if e["type"] == "bool_type":
        return f"{loc} must be JSON true or false, not {e['input']!r}"
    return f"{loc}: {e['msg']}"


def strict_args(model: type[BaseModel], arguments: Any, tool: str) -> Any:
    """``arguments`` validated by ``model``; ToolError naming each problem (and that nothing was done)."""
    if isinstance(arguments, dict) and REFUSED_KEY in arguments:
        raise ToolError(f"{tool}: {arguments[REFUSED_KEY]}; nothing was done")
    try:
        return model.model_validate(arguments if arguments is not None else {})
    except ValidationError as exc:
        raise ToolError(
            f"{tool}: " + "; ".join(_problem(model, e) for e in exc.errors()) + "; nothing was done"
        ) from None


def _strict_tool(fn: Callable[..., Any], model: type[BaseModel], **kwargs: Any) -> Any:
    """A ``Tool`` for ``fn(arguments)`` whose published input schema is ``model``'s and whose arguments reach ``fn``
    untouched, for ``strict_args``: the SDK's own validation is lax (it reads "yes" as true and drops unknown
    arguments)."""

    class RawArguments(FuncMetadata):
        def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
            return {"arguments": arguments_to_validate}

    tool = Tool.from_function(fn, **kwargs)
    meta = tool.fn_metadata
    tool.fn_metadata = RawArguments(
        arg_model=meta.arg_model,
        output_schema=meta.output_schema,
        output_model=meta.output_model,
        wrap_output=meta.wrap_output,
    )
    tool.parameters = model.model_json_schema()
    return tool


# What each action of ``host_manage`` asks of the service, once its arguments passed ``_manage_problem``.
_MANAGE: dict[str, Callable[[HostService, ManageArgs], Any]] = {
    "reclaim-shared-memory": lambda svc, args: svc.shm_reclaim(confirm=args.confirm, paths=args.paths),
    "apply": lambda svc, args: svc.apply_saved(args.plan_id or ""),  # never empty: _manage_problem
    "switch": lambda svc, args: svc.switch(args.topology or ""),
    "promote": lambda svc, args: svc.promote(args.alias or "", args.recipe or ""),
    "sync": lambda svc, _args: svc.sync(),
}


def build_server(
    service: Callable[[], HostService], *, name: str = "reconciler", on_refused: Callable[[str], None] | None = None
) -> MCPServer:
    """The MCP server over ``service()`` (a fresh ``HostService`` per call, naming the caller for the audit).
    ``on_refused(reason)``: a ``host_manage`` call refused for its arguments (audited; by default through
    ``service().record``)."""

    def refused(reason: str) -> None:
        if on_refused is not None:
            on_refused(reason)
            return
        try:
            service().record("host_manage", outcome="refused", reason=reason)
        except ReconcilerError:
            return  # no host file to name the audit trail by: the caller still gets the refusal

    def host_status(arguments: dict[str, Any]) -> Json:
        strict_args(NoArgs, arguments, "host_status")
        return _call(lambda: service().status())

    def host_plan(arguments: dict[str, Any]) -> Json:
        args = strict_args(PlanArgs, arguments, "host_plan")
        return _call(lambda: service().plan(save=args.save))

    def host_shared_memory(arguments: dict[str, Any]) -> Json:
        strict_args(NoArgs, arguments, "host_shared_memory")
        return _call(lambda: service().shm_status())

    def host_probe(arguments: dict[str, Any]) -> Json:
        args = strict_args(ProbeArgs, arguments, "host_probe")
        return _call(lambda: service().probe(args.recipe, suite=args.suite))

    def host_manage(arguments: dict[str, Any]) -> Json:
        try:
            args = strict_args(ManageArgs, arguments, "host_manage")
            problem = _manage_problem(args)
            if problem:
                raise ToolError(f"host_manage: {problem}; nothing was done")
        except ToolError as exc:
            refused(str(exc))
            raise
        return _call(lambda: _MANAGE[args.action](service(), args))

    tools = [
        _strict_tool(
            host_status,
            NoArgs,
            name="host_status",
            title="Host status",
            description="What is on each GPU slot, the containers, the offload shm, converged or not: the same JSON "
            "as `reconciler status --json`. Read-only.",
            annotations=ToolAnnotations(title="Host status", **READ_ONLY),
        ),
        _strict_tool(
            host_plan,
            PlanArgs,
            name="host_plan",
            title="Plan (dry run)",
            description="What the reconciler would change and why, changing nothing: the same JSON as "
            "`reconciler plan --json`. With save (the default) the plan is kept on the host for a day and its "
            "'plan_id' is what host_manage's 'apply' carries out. Read-only for the host.",
            annotations=ToolAnnotations(title="Plan (dry run)", **READ_ONLY),
        ),
        _strict_tool(
            host_shared_memory,
            NoArgs,
            name="host_shared_memory",
            title="Shared memory (offload files)",
            description="The offload files in the host's shm dir, their size, who maps or holds each (pid, "
            "container) and whether it is owned, an orphan or blocked: the same JSON as `reconciler shm status "
            "--json`. Read-only.",
            annotations=ToolAnnotations(title="Shared memory (offload files)", **READ_ONLY),
        ),
        _strict_tool(
            host_probe,
            ProbeArgs,
            name="host_probe",
            title="Probe a lane",
            description="Run one suite of a recipe's functional probes against its running lane, now: 'preflight' "
            "(what every enter runs: smoke, structured JSON, 8K retrieval, tools, streaming tools, tool-result "
            "continuation, Responses) or 'regression' (on demand: a ~128K needle, a 20-request shared-prefix tool "
            "batch, ...), or 'all'. Each probe's result and what came back, and the free VRAM of the lane's cards "
            "at their lowest meanwhile, with the probe that ran then: the same JSON as `reconciler probe RECIPE "
            "--suite SUITE --json`. Starts and stops nothing; the run is written to the audit trail.",
            annotations=ToolAnnotations(title="Probe a lane", **PROBE),
        ),
        _strict_tool(
            host_manage,
            ManageArgs,
            name="host_manage",
            title="Manage the host",
            description="Change the host, guarded exactly as the command line is. action 'reclaim-shared-memory': "
            "the guarded cleanup of orphan offload files, a dry run unless confirm is JSON true (the same JSON as "
            "`reconciler shm reclaim --json`; refused while a native-offload container runs or a source cannot be "
            "read); 'paths' limits a confirmed reclaim to files a dry run listed. action 'apply': carry out the plan "
            "host_plan saved, named by plan_id; refused as stale, with what changed, when the host or its files "
            "changed since. action 'switch': set the manifest's running topology to 'topology' (its topology: value "
            "alone; the same JSON as `reconciler switch NAME --json`), which the loop then converges (sleeping lanes "
            "wake in seconds). action 'promote': set the recipe the manifest's alias 'alias' names to 'recipe' (its value "
            "alone; the same JSON as `reconciler promote ALIAS RECIPE --json`), refused unless the kept evidence for "
            "the recipe's current hash passes every gate of the alias, each failed gate named with its figure. "
            "action 'sync': fetch the host's git source now and take its newest commit where its "
            "files validate and its canaries converged it (the same JSON as `reconciler sync --json`). Arguments are "
            "checked strictly: any other type or argument is refused. Every call that changes something, or is "
            "refused, is written to the host's audit trail.",
            annotations=ToolAnnotations(title="Manage the host", **DESTRUCTIVE),
        ),
    ]
    return MCPServer(name, version=__version__, instructions=INSTRUCTIONS, log_level="WARNING", tools=tools)


# ---------------------------------------------------------------- stdio


class StrictLines:
    """The stdin of ``reconciler mcp``, line by line, each read by ``reconciler.base.jsonstrict``: a line with a
    duplicate key or nested too deep never reaches the SDK as it came. A ``tools/call`` is passed on with its arguments
    replaced by the refusal (``REFUSED_KEY``), so the tool answers it as an error naming why; any other request
    becomes a call of a method no server has, answered as an error by the SDK."""

    def __init__(self, lines: Any):
        self.lines = lines

    def __aiter__(self) -> "StrictLines":
        self._it = self.lines.__aiter__()
        return self

    async def __anext__(self) -> str:
        line = await self._it.__anext__()
        return refuse_line(line)


def refuse_line(line: str) -> str:
    """``line`` as it came when it is strict JSON (or not JSON at all: the SDK answers that), else its refusal."""
    try:
        jsonstrict.loads(line)
        return line
    except jsonstrict.StrictJsonError as exc:
        reason = str(exc)
    if reason == "not JSON":
        return line
    try:
        msg = json.loads(line) if jsonstrict.depth(line.encode("utf-8", "surrogatepass")) <= 200 else None
    except ValueError:
        msg = None
    if not isinstance(msg, dict):
        return line
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": msg.get("id")}
    params = msg.get("params")
    if msg.get("method") == "tools/call" and isinstance(params, dict) and isinstance(params.get("name"), str):
        out.update(method="tools/call", params={"name": params["name"], "arguments": {REFUSED_KEY: reason}})
    else:
        out["method"] = f"refused: {reason}"
    if out["id"] is None:
        out.pop("id")
    return json.dumps(out) + "\n"


def serve_stdio(root: str) -> int:
    """``reconciler mcp``: the server over stdin/stdout until the client closes it. Destructive calls take the host
    lock file, so they are refused while a loop (``reconciler run``) holds it: use its ``/mcp`` then."""
    server = build_server(lambda: HostService(root, caller=Caller("mcp", "stdio")))

    async def serve() -> None:
        stdin = StrictLines(anyio.wrap_file(TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")))
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):  # type: ignore[arg-type]
            low = server._lowlevel_server  # the SDK's own run_stdio_async does the same, on its stdin
            await low.run(read_stream, write_stream, low.create_initialization_options())

    anyio.run(serve)
    return 0
