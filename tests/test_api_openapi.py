"""The HTTP API's OpenAPI document is generated from its routes and their pydantic models (``reconciler.api``):
it passes the OpenAPI 3.1 specification's own validator, names every route the app serves with the request model
it reads, and a document broken on purpose fails the same validator (the check can fail)."""

from __future__ import annotations

import copy

import pytest
from openapi_spec_validator import validate

from reconciler import api


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
