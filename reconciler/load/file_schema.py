"""JSON Schemas (draft 2020-12) of the three kinds of file an operator writes, generated from the model.

``reconciler schema host|recipe|manifest`` prints one; ``schemas/`` in the repository publishes them (a test keeps
those files equal to what this module generates), and the shipped files point editors at them. A schema says what
types, bounds, enums and regular expressions can (docs/design.md, "The files the operator writes"); the loader stays
the judge of the rest: cross-references between files, the tmpfs, secrets, duplicate keys.

Imported by that command and the tests only: generating a schema costs pydantic's schema build, which no other
command pays.
"""

from __future__ import annotations

import json
from typing import Any

DIALECT = "https://json-schema.org/draft/2020-12/schema"

# kind -> (the model class's name in reconciler.model, where the file lives, the published schema's file name)
KINDS: dict[str, tuple[str, str, str]] = {
    "host": ("HostConfig", "configs/host.yaml", "host.schema.json"),
    "recipe": ("Recipe", "configs/recipes/NAME.toml", "recipe.schema.json"),
    "manifest": ("Manifest", "manifests/NAME.yaml", "manifest.schema.json"),
}


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind of file, as a JSON value."""
    # The start-up budget: ``--help`` builds this command's choices from KINDS and must not import the model.
    from reconciler import model

    class_name, where, _ = KINDS[kind]
    generated = getattr(model, class_name).model_json_schema(mode="validation")
    generated["title"] = f"reconciler {kind} file ({where})"
    return {"$schema": DIALECT, **generated}


def render(kind: str) -> str:
    """The schema as published: two-space JSON, keys in the model's order, one trailing newline."""
    return json.dumps(schema(kind), indent=2, ensure_ascii=False) + "\n"
