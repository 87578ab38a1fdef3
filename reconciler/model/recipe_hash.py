"""A recipe's content hash, the label that says a running lane is still what its recipe makes: what it covers, and
how a release that adds a key or changes a default keeps every running lane's hash (docs/design.md, "The recipe's
hash across releases").

Hash version 1 is the key set of the release that first labelled lanes: ``HASH_V1_KEYS``, committed here and never
edited. Those keys are hashed as that release hashed them, each with its value or its default, byte for byte. A key
added since is hashed only where the recipe's value differs from the key's default (the default it was added with),
so adding a key with a default moves no hash and restarts no lane. A default changed since is a migration
(``DEFAULT_CHANGES``, each written in docs/changelog.md): every recipe that leaves the key unwritten gets a new hash,
the containers created from then on are labelled with one more hash version, and ``changes_since`` names the change
for the plan that recreates the lanes it touches.

Pure: called by ``reconciler.model.recipe.Recipe.content_hash`` and by the planner's recreate reason.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# What a recipe says of checking, stopping and sleeping the lane, not of what runs in it: never hashed.
NOT_HASHED = frozenset({"description", "gpu_reserve", "probes", "drain", "sleep"})
# Keys inside a section that say how the lane is asked, not what runs in it: never hashed either. ``model.served_names``
# names what the front door routes to a server that takes its names otherwise than by --served-model-name.
NOT_HASHED_NESTED = {"model": {"served_names": True}}

# Hash version 1: every key the recipe's hash covered when lanes were first labelled. Never edit this list: a running
# lane's label is the hash of these keys, defaults included (tests/unit/test_recipe_hash.py holds each still a key).
HASH_V1_KEYS = frozenset(
    {
        "tensor_parallel_size",
        "model",
        "model.id",
        "model.revision",
        "container",
        "container.image",
        "container.command",
        "container.entrypoint",
        "container.env",
        "container.volumes",
        "container.ipc",
        "container.network",
        "container.init",
        "container.shm_size",
        "container.user",
        "offload",
        "offload.enabled",
        "offload.capacity_gib",
        "health",
        "health.url",
        "health.settle_s",
        "health.start_timeout_s",
        "stop",
        "stop.timeout_s",
    }
)


@dataclass(frozen=True)
class DefaultChange:
    """A hashed key's default changed by a release: a migration. Recipes that leave ``path`` unwritten hash
    differently from ``version`` on, and their running lanes are recreated, the plan naming this change."""

    version: int  # the hash version this change starts (2 for the first)
    path: str  # the key, as in HASH_V1_KEYS ("stop.timeout_s")
    old: Any  # its default before, as that release's model held it (180, not 180.0: the hash is of its JSON)
    new: Any  # its default from ``version`` on (the model's default)
    note: str  # why, as docs/changelog.md says it

    def describe(self) -> str:
        return (
            f"{self.path} defaults to {self.new!r} instead of {self.old!r} (hash version {self.version}: {self.note})"
        )


# Each change of a hashed key's default, oldest first; each also in docs/changelog.md. None so far.
DEFAULT_CHANGES: tuple[DefaultChange, ...] = ()


def hash_version(changes: tuple[DefaultChange, ...] | None = None) -> int:
    """The hash version this release labels its containers with: 1, and one more for each default changed."""
    changes = DEFAULT_CHANGES if changes is None else changes
    return max((c.version for c in changes), default=1)


def _first_default(model: type[BaseModel], name: str, path: str, changes: tuple[DefaultChange, ...]) -> Any:
    """The default a key was added with: the oldest change's ``old`` where its default changed since, else today's."""
    for c in changes:
        if c.path == path:
            return c.old
    return model.model_fields[name].get_default(call_default_factory=True)


def _prune(model: BaseModel, dump: dict[str, Any], prefix: str, changes: tuple[DefaultChange, ...]) -> None:
    """Drops from ``dump`` (``model``'s JSON form) each key added after hash version 1 that holds its default."""
    for name in type(model).model_fields:
        if name not in dump:
            continue
        path = prefix + name
        value = getattr(model, name)
        if path not in HASH_V1_KEYS:
            default = _first_default(type(model), name, path, changes)
            if default is not PydanticUndefined and value == default:
                del dump[name]
                continue
        if isinstance(value, BaseModel) and isinstance(dump[name], dict):
            _prune(value, dump[name], path + ".", changes)


def hashed_form(recipe: BaseModel, changes: tuple[DefaultChange, ...] | None = None) -> dict[str, Any]:
    """The recipe as its hash sees it: its JSON form without the keys never hashed and without each later key that
    holds its default."""
    changes = DEFAULT_CHANGES if changes is None else changes
    exclude: dict[str, Any] = {k: True for k in NOT_HASHED} | NOT_HASHED_NESTED
    dump = recipe.model_dump(mode="json", exclude=exclude)
    _prune(recipe, dump, "", changes)
    return dump


def content_hash(recipe: BaseModel, changes: tuple[DefaultChange, ...] | None = None) -> str:
    """16 hex digits of sha256 over the hashed form, as JSON with sorted keys and no spaces."""
    canon = json.dumps(hashed_form(recipe, changes), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def _written(model: BaseModel, path: str) -> bool:
    """Whether the operator wrote ``path`` (each step of it set in the file, not filled in by a default)."""
    node: Any = model
    for name in path.split("."):
        if not isinstance(node, BaseModel) or name not in node.model_fields_set:
            return False
        node = getattr(node, name)
    return True


def changes_since(
    recipe: BaseModel, version: int, changes: tuple[DefaultChange, ...] | None = None
) -> list[DefaultChange]:
    """The default changes after hash version ``version`` that touch ``recipe`` (it leaves their key unwritten)."""
    changes = DEFAULT_CHANGES if changes is None else changes
    return [c for c in changes if c.version > version and not _written(recipe, c.path)]


def _with(model: _M, path: str, value: Any) -> _M:
    head, _, rest = path.partition(".")
    if not rest:
        return model.model_copy(update={head: value})
    return model.model_copy(update={head: _with(getattr(model, head), rest, value)})


_M = TypeVar("_M", bound=BaseModel)


def as_of(recipe: _M, version: int, changes: tuple[DefaultChange, ...] | None = None) -> _M:
    """The recipe as a release of hash version ``version`` read it: each key whose default changed since, and
    which the operator left unwritten, at the default it had then."""
    changes = DEFAULT_CHANGES if changes is None else changes
    out = recipe
    for c in reversed(changes_since(recipe, version, changes)):  # newest first, so the oldest default is the last set
        out = _with(out, c.path, c.old)
    return out
