"""manifests/NAME.yaml as pydantic types: the desired state of one host, as the operator edits it.

Read by ``reconciler.load.desired``, which checks it against the host file and the recipes.
"""

from __future__ import annotations

from pydantic import Field

from reconciler.model.rules import NAME_PATTERN
from reconciler.model.strict import _pattern, _Strict


class AssignmentSpec(_Strict):
    """One container that should run: a recipe on GPU slots."""

    recipe: str = Field(
        min_length=1,
        description="A recipe's name: configs/recipes/NAME.toml.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    gpus: list[str] = Field(
        min_length=1,
        description="The GPU slots it runs on (names from configs/host.yaml), as many as the recipe's "
        "tensor_parallel_size; a slot runs one recipe at a time.",
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": NAME_PATTERN}},
    )


class Manifest(_Strict):
    """manifests/NAME.yaml: the desired state of one host, what the operator edits."""

    host: str = Field(
        description="The host this manifest is for: the name in configs/host.yaml.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    assignments: list[AssignmentSpec] = Field(
        default_factory=list, description="One entry per container; a GPU slot not listed is free (none: all free)."
    )
    fallback: bool = Field(
        default=True,
        description="While a wanted lane's enter failed and waits in backoff, bring back the last converged "
        "topology on the slots it needed (false: leave them empty until the next attempt).",
    )
