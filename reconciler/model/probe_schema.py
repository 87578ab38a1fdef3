"""The JSON Schemas a recipe's probes carry (``json_schema``, a tool's ``parameters``), checked at load: valid by
draft 2020-12's meta-schema, made only of keywords that check something or are known annotations, and with every
reference resolving within the schema.

Called by the probe models' validators (``reconciler.model.probe_spec``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.exceptions import SchemaError

# Keywords a JSON Schema may carry that validate nothing (annotations and structure): accepted beside the
# validating keywords of draft 2020-12. Anything else is refused at load: a misspelt keyword would check nothing,
# and a probe that checks less than it says passes an engine it should fail.
_SCHEMA_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$defs",
        "definitions",
        "$comment",
        "$vocabulary",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)


def check_json_schema(schema: object, where: str) -> str | None:
    """A JSON Schema (draft 2020-12) a probe checks answers against: valid by the meta-schema, and made only of
    keywords the validator applies or knows as annotations. jsonschema is imported here, on first use: only a
    recipe that carries a schema pays for it."""
    # The start-up budget: jsonschema costs every command that loads a recipe; only a schema-carrying one pays it.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        return f"{where} must be a table (a JSON Schema object)"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return _not_a_schema(exc, where)
    known = set(Draft202012Validator.VALIDATORS) | _SCHEMA_ANNOTATIONS
    return _unknown_keyword(schema, where, known) or _unresolved_ref(schema, where)


def _not_a_schema(exc: SchemaError, where: str) -> str:
    """What the meta-schema found wrong, at its place in the schema."""
    path = list(exc.absolute_path)
    at = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in path)
    if path and path[-1] == "type":
        return (
            f"{where}{at} {exc.instance!r} is not a JSON Schema type (object, array, string, integer, number, "
            "boolean, null, or a list of them)"
        )
    return f"{where}{at} is not a valid JSON Schema: {exc.message}"


def _unknown_keyword(node: object, path: str, known: set[str]) -> str | None:
    """The first schema object (this one or one below it) with a keyword that is not in ``known``, as a problem."""
    if not isinstance(node, dict):
        return None  # a boolean schema (true/false): nothing to misspell
    unknown = sorted(set(node) - known)
    if unknown:
        return (
            f"{path}: unknown JSON Schema keyword(s) {', '.join(unknown)} (draft 2020-12); a misspelt keyword "
            "would check nothing: fix or remove it"
        )
    subs = [(f"{path}.{key}.{name}", sub) for key in _SUBSCHEMA_MAPS for name, sub in (node.get(key) or {}).items()]
    subs += [(f"{path}.{key}[{i}]", sub) for key in _SUBSCHEMA_LISTS for i, sub in enumerate(node.get(key) or ())]
    subs += [(f"{path}.{key}", node[key]) for key in _SUBSCHEMA_ONE if key in node]
    for at, sub in subs:
        if problem := _unknown_keyword(sub, at, known):
            return problem
    return None


def _unresolved_ref(schema: dict[str, object], where: str) -> str | None:
    """The first ``$ref`` (or ``$dynamicRef``) of a schema that does not resolve within it, as a problem; None when
    all do. A probe checks answers offline: a reference to another document, or to a definition the schema lacks,
    would fail only when an enter's probe first reaches it. Resolved as jsonschema resolves them (its ``referencing``
    library), each from the base URI of the schema object it stands in."""
    # The start-up budget, as for jsonschema above: only a recipe whose probes carry a schema pays for these.
    from referencing import Registry, Resource
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root = Resource.from_contents(schema, default_specification=DRAFT202012)
    base = root.id() or "urn:reconciler:probe-schema"
    resolver = Registry().with_resource(base, root).resolver(base_uri=base)
    skip = {"enum", "const", "default", "examples"}  # values, not schemas

    def walk(node: object, path: str, resolver: Any) -> str | None:
        if isinstance(node, list):
            for i, sub in enumerate(node):
                if problem := walk(sub, f"{path}[{i}]", resolver):
                    return problem
            return None
        if not isinstance(node, dict):
            return None
        if node is not schema and isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(Resource.from_contents(node, default_specification=DRAFT202012))
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    return (
                        f"{path}.{key} {ref!r} does not resolve within the schema: a probe's schema is checked "
                        "offline, so each reference must point into it (#/$defs/NAME, with NAME defined under $defs)"
                    )
        for k, v in node.items():
            if k not in skip and (problem := walk(v, f"{path}.{k}", resolver)):
                return problem
        return None

    return walk(schema, where, resolver)
