"""A small JSON Schema subset, for the structured-JSON probes of recipes: checked at load, applied to answers.

Pure, standard library only. Supported keywords (draft 2020-12 meaning): ``type`` (a name or a list),
``properties``, ``required``, ``additionalProperties`` (a boolean or a schema), ``items``, ``minItems``,
``maxItems``, ``enum``, ``const``, ``minimum``, ``maximum``, ``minLength``, ``maxLength``, ``pattern``, and the
annotations ``title``, ``description``, ``$schema``. Any other keyword is refused when the recipe is loaded rather
than silently ignored: a probe that checks less than it says would pass an engine it should fail.
"""

from __future__ import annotations

import re
from typing import Any

KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
        "minimum", "maximum", "minLength", "maxLength", "pattern", "title", "description", "$schema",
    }
)
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


def schema_problem(schema: Any, where: str = "json_schema") -> str | None:
    """None when ``schema`` uses only the supported subset correctly, else one sentence naming the place."""
    if not isinstance(schema, dict):
        return f"{where} must be a table (a JSON Schema object)"
    unknown = sorted(set(schema) - KEYWORDS)
    if unknown:
        return (
            f"{where}: unsupported JSON Schema keyword(s) {', '.join(unknown)}; supported: "
            f"{', '.join(sorted(KEYWORDS))}"
        )
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in TYPES:
            return f"{where}.type {k!r} is not one of {', '.join(TYPES)}"
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            return f"{where}.properties must be a table of schemas"
        for name, sub in props.items():
            problem = schema_problem(sub, f"{where}.properties.{name}")
            if problem:
                return problem
    req = schema.get("required")
    if req is not None and not (isinstance(req, list) and all(isinstance(r, str) for r in req)):
        return f"{where}.required must be a list of property names"
    extra = schema.get("additionalProperties")
    if extra is not None and not isinstance(extra, bool):
        problem = schema_problem(extra, f"{where}.additionalProperties")
        if problem:
            return problem
    if "items" in schema:
        problem = schema_problem(schema["items"], f"{where}.items")
        if problem:
            return problem
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        return f"{where}.enum must be a non-empty list"
    for key in ("minItems", "maxItems", "minLength", "maxLength"):
        if key in schema and not (isinstance(schema[key], int) and not isinstance(schema[key], bool) and schema[key] >= 0):
            return f"{where}.{key} must be a whole number >= 0"
    for key in ("minimum", "maximum"):
        if key in schema and (isinstance(schema[key], bool) or not isinstance(schema[key], (int, float))):
            return f"{where}.{key} must be a number"
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as exc:
            return f"{where}.pattern is not a valid regular expression ({exc})"
    return None


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return value is None


def violations(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Where ``value`` does not match ``schema`` (empty: it matches), each as ``PATH: what is wrong``."""
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_type_ok(value, k) for k in kinds):
            return [f"{path}: expected {' or '.join(kinds)}, got {_json_type(value)}"]
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                out.append(f"{path}: required property {name!r} is missing")
        for name, sub in props.items():
            if name in value:
                out += violations(value[name], sub, f"{path}.{name}")
        extra = schema.get("additionalProperties")
        for name in value:
            if name in props:
                continue
            if extra is False:
                out.append(f"{path}: property {name!r} is not allowed")
            elif isinstance(extra, dict):
                out += violations(value[name], extra, f"{path}.{name}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{path}: {len(value)} item(s), at least {schema['minItems']} expected")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{path}: {len(value)} item(s), at most {schema['maxItems']} expected")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                out += violations(item, schema["items"], f"{path}[{i}]")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(f"{path}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{path}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__
