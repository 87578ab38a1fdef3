"""What a request may carry, checked before a route calls the service: the bodies (``ReclaimBody``, ``ApplyBody``, ``SwitchBody``)
and queries (``PlanQuery``, ``AuditQuery``, ``ProbeQuery``) as pydantic models, ``ErrorBody`` (what a refused
request gets), and their readers: ``strict_json`` (one strict parser for every body), ``_query`` and ``_body``
(a ``_BadRequest`` naming the field and why).

Used by the routes, the guard (``strict_json``) and the OpenAPI document (the models' JSON Schemas).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from starlette.requests import Request

from reconciler.api.errors import _BadRequest
from reconciler.base import jsonstrict
from reconciler.base.requests import (
    ALIAS_PATTERN,
    DEFAULT_SUITE,
    MAX_RECLAIM_PATHS,
    PLAN_ID_PATTERN,
    PROBE_SUITES,
    RECIPE_HELP,
    RECIPE_PATTERN,
    TOPOLOGY_PATTERN,
    ProbeSuite,
    is_recipe,
)


def strict_json(raw: bytes) -> Any:
    """``raw`` as JSON read strictly (``reconciler.base.jsonstrict``: no duplicate key, bounded nesting);
    _BadRequest."""
    try:
        return jsonstrict.loads(raw)
    except jsonstrict.StrictJsonError as exc:
        msg = str(exc)
        raise _BadRequest("the body is not JSON" if msg == "not JSON" else f"the body: {msg}") from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReclaimBody(_Strict):
    """POST /v1/shm/reclaim: the guarded cleanup of orphan offload files."""

    confirm: StrictBool = Field(False, description="remove the orphans (JSON true, nothing else); without it a dry run")
    paths: list[str] | None = Field(
        None, max_length=MAX_RECLAIM_PATHS, description="remove nothing but these paths (from a dry run)"
    )


class ApplyBody(_Strict):
    """POST /v1/apply: carry out a plan saved by GET /v1/plan?save=true."""

    plan_id: str = Field(pattern=PLAN_ID_PATTERN, description="from GET /v1/plan?save=true")


class SwitchBody(_Strict):
    """POST /v1/switch: set the manifest's running topology (its ``topology:`` value alone); the loop converges it."""

    topology: str = Field(pattern=TOPOLOGY_PATTERN, description="a name under the manifest's topologies:")


class PromoteBody(_Strict):
    """POST /v1/promote: set the recipe an alias names, when its evidence passes every gate of the alias."""

    alias: str = Field(pattern=ALIAS_PATTERN, description="a name under the manifest's aliases:")
    recipe: str = Field(pattern=RECIPE_PATTERN, description="the recipe the alias is to name")


class SyncBody(_Strict):
    """POST /v1/sync: fetch the host's git source now (no fields; an empty body will do)."""


class _Query(BaseModel):
    # A query string carries text only: its values are read as pydantic reads text (save=true, save=1).
    model_config = ConfigDict(extra="forbid")


class PlanQuery(_Query):
    save: bool = Field(False, description="keep the plan; its plan_id is for POST /v1/apply")


class AuditQuery(_Query):
    since: str | None = Field(None, description="epoch seconds, an ISO time, or an age: 90s, 15m, 2h, 7d")


def probe_params(recipe: str | None, suite: str | None) -> tuple[str, str]:
    """``GET /v1/probe``'s query, checked before anything runs: a recipe name and a suite."""
    if not recipe or not is_recipe(recipe):
        raise _BadRequest("recipe: give the recipe's name (lowercase letters, digits and '._-'), e.g. ?recipe=omni")
    suite = suite or DEFAULT_SUITE
    if suite not in PROBE_SUITES:
        raise _BadRequest(f"suite: {suite!r} is not one of {', '.join(PROBE_SUITES)}")
    return recipe, suite


class ProbeQuery(_Query):
    recipe: str = Field(pattern=RECIPE_PATTERN, description=RECIPE_HELP)
    suite: ProbeSuite = Field(
        DEFAULT_SUITE, description="preflight (what every enter runs), regression (on demand) or all"
    )


class ErrorBody(BaseModel):
    """What a refused request gets (the command-line answers carry their own ``error`` object instead)."""

    error: str | dict[str, Any]
    problems: list[dict[str, Any]] | None = Field(None, description="422: each problem with path, line, message")


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())


def _query(request: Request, model: type[BaseModel]) -> Any:
    params = request.query_params
    for key in params:
        if len(params.getlist(key)) > 1:
            raise _BadRequest(f"{key} is given more than once")
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        raise _BadRequest(_errors(exc)) from None


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()  # read whole and checked by the Guard already
    if not raw.strip():
        data: Any = {}
    else:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise _BadRequest(f"send the body as application/json, not {ctype}")
        data = strict_json(raw)
    if not isinstance(data, dict):
        raise _BadRequest("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _BadRequest(_errors(exc)) from None
