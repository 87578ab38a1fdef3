"""What a release makes of the containers an earlier release (or a later one) made: which recreate a changed default
alone causes, and the reason the plan gives it (docs/design.md, "The recipe's hash across releases").

Pure. Called by ``reconciler.plan.planner`` for a running container of ours that differs from what its recipe makes.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe, recipe_hash
from reconciler.plan import spec
from reconciler.plan.observed import LABEL_HASH_VERSION, LABEL_SPEC_PARTS, ContainerView


def migrations(
    host: HostConfig,
    recipe: Recipe,
    slots: tuple[str, ...],
    *,
    version: int,
    parts_label: str | None,
    hash_label: str | None,
    secret_digests: Mapping[str, str] | None = None,
) -> list[recipe_hash.DefaultChange]:
    """Pure: the defaults changed since hash version ``version`` that alone make a container of that version differ
    from what ``recipe`` makes now (its labels are what the recipe rendered as that version read it); empty when none
    changed since or the container differs otherwise."""
    changes = recipe_hash.changes_since(recipe, version)
    if not changes:
        return []
    before = recipe_hash.as_of(recipe, version)
    if parts_label is None:
        same = before.content_hash() == hash_label
    else:
        same = not spec.changed_parts(parts_label, spec.part_hashes(host, before, slots, secret_digests=secret_digests))
    return changes if same else []


def recreate_reason(c: ContainerView, d: DesiredAssignment, parts: dict[str, str], desired: DesiredState) -> str:
    """The reason of a recreate that a release's changed default alone makes (docs/design.md, "The recipe's hash
    across releases"), or of one of a container a newer release made; "" for any other."""
    known, version = recipe_hash.hash_version(), c.hash_version
    hashes = f"(hash {c.spec_hash or c.recipe_hash} -> {spec.spec_hash(parts)})"
    if version is None or version > known:
        return (
            f"{c.name} was made by a newer reconciler (hash version {c.label(LABEL_HASH_VERSION)}; this one's is "
            f"{known}) and differs from what this one makes of {d.recipe} {hashes}: recreate"
        )
    changes = migrations(
        desired.host,
        desired.recipes[d.recipe],
        d.slots,
        version=version,
        parts_label=c.label(LABEL_SPEC_PARTS),
        hash_label=c.recipe_hash,
        secret_digests=desired.secret_digests,
    )
    if not changes:
        return ""
    said = "; ".join(ch.describe() for ch in changes)
    return (
        f"{c.name} was made before a release changed a default its recipe leaves unwritten: {said} "
        f"(see the changelog) {hashes}: recreate"
    )
