"""The HTTP API's OpenAPI document is generated from its routes and their pydantic models (``reconciler.api``):
it passes the OpenAPI 3.1 specification's own validator, names every route the app serves with the request model
it reads, and a document broken on purpose fails the same validator (the check can fail)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from openapi_spec_validator import validate
from real.test_api import quiet_loop  # noqa: F401 - the fixture: a real loop whose passes change nothing

from reconciler.api import endpoints as api


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = api.openapi()
    assert doc["openapi"] == "3.1.0"
    validate(doc)


def test_it_is_generated_from_the_routes_and_their_models() -> None:
    doc = api.openapi()
    for ep in api.ENDPOINTS:
        op = doc["paths"][ep.path][ep.method.lower()]
        assert op["operationId"] == ep.handler.__name__
        assert ("security" in op and op["security"] == []) == ep.public, ep.path
        if ep.body is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{ep.body.__name__}"
            assert doc["components"]["schemas"][ep.body.__name__] == ep.body.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
        if ep.query is not None:
            assert {p["name"] for p in op["parameters"]} == set(ep.query.model_fields)
    reclaim = doc["components"]["schemas"]["ReclaimBody"]
    assert reclaim["additionalProperties"] is False and reclaim["properties"]["confirm"]["type"] == "boolean"
    assert doc["components"]["schemas"]["ApplyBody"]["properties"]["plan_id"]["pattern"] == "^[0-9a-f]{32}$"


def test_a_broken_document_is_refused_by_the_same_validator() -> None:
    broken = copy.deepcopy(api.openapi())
    broken["paths"]["/v1/status"]["get"]["responses"] = "none"
    with pytest.raises(Exception):  # noqa: B017 - the validator's own error type differs between releases
        validate(broken)


def _response_schema(doc: dict, path: str, method: str, status: int, content_type: str) -> dict:
    """The documented schema of one answer, with the document's components beside it for its $refs."""
    responses = doc["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} answered {status}, which the document does not list"
    content = responses[str(status)]["content"]
    kind = content_type.split(";")[0].strip()
    assert kind in content, f"{method} {path} {status} answered {kind}; the document says {sorted(content)}"
    return {**content[kind]["schema"], "components": doc["components"]}


@pytest.mark.docker
@pytest.mark.root
def test_the_running_loops_real_answers_match_the_document(quiet_loop: tuple[Any, Any]) -> None:  # noqa: F811
    """Every route of a real `reconciler run`, asked as a client would (with and without the token, a bad body):
    each answer's status, content type and body are what the document says."""
    import jsonschema

    _lp, client = quiet_loop
    doc = api.openapi()
    calls = [
        ("GET", "/v1/status", None, None),
        ("GET", "/v1/plan", None, None),
        ("GET", "/v1/shm", None, None),
        ("GET", "/v1/audit", None, None),
        ("GET", "/v1/openapi.json", None, None),
        ("POST", "/v1/shm/reclaim", {"confirm": False}, None),
        ("POST", "/v1/apply", {"plan_id": "0" * 32}, None),
        ("GET", "/v1/status", None, "wrong-token"),
        ("POST", "/v1/shm/reclaim", {"confirm": "yes"}, None),
        ("GET", "/metrics", None, None),
        ("GET", "/healthz", None, None),
    ]
    for method, path, body, token in calls:
        kwargs = {} if token is None else {"token": token}
        status, headers, answer = client.call(method, path, body, **kwargs)
        schema = _response_schema(doc, path, method, status, headers.get("content-type", ""))
        if isinstance(answer, (dict, list)):
            jsonschema.validate(answer, schema)
        else:
            assert schema.get("type") == "string", (method, path, status, answer)
