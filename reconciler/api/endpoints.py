"""The API's routes as one table (``ENDPOINTS``: path, method, handler, query and body models, answers) and the
OpenAPI 3.1 document generated from it (``openapi()``, served at ``/v1/openapi.json`` by ``get_openapi``).

Read by ``reconciler.api.build_app`` (the Starlette routes) and by the tests of the document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconciler import __version__
from reconciler.api.limits import MAX_BODY
from reconciler.api.request_models import (
    ApplyBody,
    AuditQuery,
    ErrorBody,
    PlanQuery,
    ProbeQuery,
    PromoteBody,
    ReclaimBody,
    SwitchBody,
    SyncBody,
)
from reconciler.api.routes import (
    get_audit,
    get_healthz,
    get_metrics,
    get_plan,
    get_probe,
    get_shm,
    get_status,
    post_apply,
    post_promote,
    post_reclaim,
    post_switch,
    post_sync,
)


async def get_openapi(request: Request) -> Response:
    """This API as OpenAPI 3.1."""
    return JSONResponse(openapi())


@dataclass(frozen=True)
class Endpoint:
    """One route: what serves it and what the OpenAPI document says of it."""

    path: str
    method: str
    handler: Callable[[Request], Awaitable[Response]]
    summary: str
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    responses: dict[str, str] = field(default_factory=dict)
    command: bool = True  # answers with the command line's --json and its exit code
    public: bool = False


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/v1/status", "GET", get_status, "status --json"),
    Endpoint("/v1/plan", "GET", get_plan, "plan --json (dry run)", query=PlanQuery),
    Endpoint("/v1/shm", "GET", get_shm, "shm status --json (read-only)"),
    Endpoint("/v1/audit", "GET", get_audit, "the audit trail", query=AuditQuery),
    Endpoint(
        "/v1/probe",
        "GET",
        get_probe,
        "probe RECIPE --suite SUITE --json: one suite of a recipe's functional "
        "probes against its running lane (read-only for the host; the run goes to the audit trail)",
        query=ProbeQuery,
    ),
    Endpoint(
        "/v1/shm/reclaim",
        "POST",
        post_reclaim,
        "shm reclaim --json: a dry run unless confirm",
        body=ReclaimBody,
        responses={"409": "refused or failed (the body says why)"},
    ),
    Endpoint(
        "/v1/apply",
        "POST",
        post_apply,
        "apply a saved plan; refused when stale",
        body=ApplyBody,
        responses={"409": "stale, blocked or failed (the body says which)"},
    ),
    Endpoint(
        "/v1/switch",
        "POST",
        post_switch,
        "switch NAME --json: set the manifest's running topology (its topology: value alone, every other byte "
        "kept); the loop converges it",
        body=SwitchBody,
        responses={"409": "refused: an unknown topology, no named topologies, or a file changed meanwhile"},
    ),
    Endpoint(
        "/v1/promote",
        "POST",
        post_promote,
        "promote ALIAS RECIPE --json: set the recipe an alias of the manifest names (its value alone, every other "
        "byte kept) when the evidence for the recipe's current hash passes every gate of the alias",
        body=PromoteBody,
        responses={
            "409": "refused: a failed gate (each named with its figure), an unknown alias or recipe, a git "
            "source, or a file changed meanwhile"
        },
    ),
    Endpoint(
        "/v1/sync",
        "POST",
        post_sync,
        "sync --json: fetch the host's git source now and take its newest commit where its files validate and its "
        "canaries converged it; the loop converges it",
        body=SyncBody,
        responses={"409": "refused (no source), or the newest commit refused, stopped or not fetched (the body says)"},
    ),
    Endpoint("/v1/openapi.json", "GET", get_openapi, "this description", command=False),
    Endpoint("/metrics", "GET", get_metrics, "Prometheus metrics (text exposition format)", command=False, public=True),
    Endpoint(
        "/healthz",
        "GET",
        get_healthz,
        "200 after a recent pass that read every source, else 503",
        command=False,
        public=True,
        responses={"503": "no recent pass, or a source unavailable"},
    ),
)


def openapi() -> dict[str, Any]:
    """This API as OpenAPI 3.1, generated from ``ENDPOINTS`` and their pydantic models."""
    ref = "#/components/schemas/{model}"
    schemas: dict[str, Any] = {}

    def schema_of(model: type[BaseModel]) -> dict[str, Any]:
        s = model.model_json_schema(ref_template=ref)
        schemas.update(s.pop("$defs", {}))
        return s

    error = {"description": "", "content": {"application/json": {"schema": {"$ref": ref.format(model="ErrorBody")}}}}
    schemas["ErrorBody"] = schema_of(ErrorBody)
    command = {"type": "object", "additionalProperties": True}
    paths: dict[str, Any] = {}
    for ep in ENDPOINTS:
        responses: dict[str, Any] = {}
        if ep.command:
            responses["200"] = {
                "description": "the command line's --json",
                "content": {"application/json": {"schema": command}},
                "headers": {
                    "X-Reconciler-Exit-Code": {
                        "schema": {"type": "integer"},
                        "description": "the command line's exit code",
                    }
                },
            }
        elif ep.path == "/metrics":
            responses["200"] = {
                "description": "text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        else:
            responses["200"] = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
        if not ep.public:
            responses["401"] = {**error, "description": "no token, or a wrong one"}
        responses["421"] = {**error, "description": "a Host header this listener does not answer to"}
        if ep.query is not None or ep.body is not None:
            responses["400"] = {**error, "description": "a bad request: the error says which field and why"}
        if ep.body is not None:
            responses["413"] = {**error, "description": f"a body over {MAX_BODY} bytes"}
        if ep.command:
            responses["422"] = {**error, "description": "the configuration is invalid (problems with file:line)"}
        for code, text in ep.responses.items():
            # A refused or failed command answers its own --json (409); /healthz its report either way (503).
            answer = {"409": command, "503": {"type": "object"}}.get(code)
            responses[code] = (
                {"description": text, "content": {"application/json": {"schema": answer}}}
                if answer is not None
                else {**error, "description": text}
            )
        op: dict[str, Any] = {"summary": ep.summary, "operationId": ep.handler.__name__, "responses": responses}
        if ep.public:
            op["security"] = []
        if ep.query is not None:
            q = schema_of(ep.query)
            required = set(q.get("required", []))
            op["parameters"] = [
                {
                    "name": name,
                    "in": "query",
                    "required": name in required,
                    "schema": {k: v for k, v in prop.items() if k not in ("description", "title")},
                    **({"description": prop["description"]} if "description" in prop else {}),
                }
                for name, prop in q.get("properties", {}).items()
            ]
        if ep.body is not None:
            name = ep.body.__name__
            schemas[name] = schema_of(ep.body)
            op["requestBody"] = {
                "required": False,
                "content": {"application/json": {"schema": {"$ref": ref.format(model=name)}}},
            }
        paths.setdefault(ep.path, {})[ep.method.lower()] = op
    paths["/mcp"] = {
        "post": {
            "summary": "MCP (streamable HTTP): host_status, host_plan, host_shared_memory, host_probe, host_manage",
            "operationId": "mcp",
            "responses": {
                "200": {"description": "a JSON-RPC answer"},
                "401": {**error, "description": "no token, or a wrong one"},
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "reconciler",
            "version": __version__,
            "description": "The HTTP API of `reconciler run`: the same guarded operations as the command line.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": schemas},
        "security": [{"bearer": []}],
        "paths": paths,
    }
