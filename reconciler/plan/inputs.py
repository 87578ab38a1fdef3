"""The desired state as values, for the approval fingerprint (``reconciler.plan.fingerprint``): every field of the
``DesiredState`` the planner was given, wherever it was loaded from (the root's files or a commit of the git source),
as digests of canonical JSON, and their differences in words.

Nothing here names a field of a recipe, a host file or the desired state: each is walked whole (a pydantic model by
``model_dump(mode="json")``, a dataclass by its fields, a map by its keys), so a field added to any of them later is
in the fingerprint without anyone adding it here. Only the granularity of the words is chosen: a recipe and the host
file by their top-level fields, a list of named things (``probes``) and a map of things (``gpus``) by each one, so a
refusal says "recipe omni's probe smoke changed" rather than that something did.

``recipe_spec`` is the digest of everything a recipe contributes to a lane (how it is entered, probed, drained,
slept and kept within its reserve): wider than ``Recipe.content_hash``, which says only when the container itself
must be made again. Pure: values in, lines out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from reconciler.model import DesiredState, Recipe

# The desired state's fields that are no part of the ``desired`` lines: the commit is the ``source`` part.
_OWN_PART = frozenset({"source_commit"})
# Words for the fields of the desired state that are not the manifest's (any other is "the manifest's FIELD").
_WORDS = {
    "host": "the host file",
    "recipes": "recipe",
    "secret_digests": "the values of the recipes' secrets",
    "manifest_path": "the manifest's file name",
}
_SEP = " sha256:"
LOCAL = "this root's own files"


def jsonable(value: Any) -> Any:
    """Pure: ``value`` as JSON values, whole: a pydantic model by every field of its own class, a dataclass by every
    field, a map by its keys, a set sorted. TypeError for anything else, so a new kind of value is never hashed by
    its ``repr`` (an address that differs in each process would make every saved plan stale)."""
    if isinstance(value, BaseModel):
        # Every field of the value's own class, walked as any value is here: a value of a subclass (a field a later
        # release or a test adds) is taken as what it is, not as the field's declared model. (pydantic's model_dump
        # with serialize_as_any needs every nested model's serializer built, which the models' deferred build leaves
        # undone before pydantic 2.14.)
        return {name: jsonable(getattr(value, name)) for name in type(value).model_fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=canonical)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"no JSON form for a {type(value).__name__} in the desired state")


def canonical(value: Any) -> str:
    """Pure: one text for equal values (keys sorted, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(jsonable(value)).encode()).hexdigest()[:24]


def recipe_spec(recipe: Recipe) -> str:
    """Pure: the digest of the whole recipe, every field (its probes, drain, sleep, reserve, description too)."""
    return digest(recipe)


def _singular(field: str) -> str:
    return field[:-1] if field.endswith("s") and len(field) > 1 else field


def _named(items: list[Any]) -> list[str] | None:
    """The names of a list of named things (each a map with its own string ``name``), or None."""
    names = [x.get("name") for x in items if isinstance(x, dict)]
    if not items or len(names) != len(items) or not all(isinstance(n, str) for n in names):
        return None
    return names if len(set(names)) == len(names) else None  # type: ignore[return-value]


def _model_lines(owner: str, dump: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """(words, value) of a model's top-level fields, a list of named things and a map of maps by each one."""
    for field, value in dump.items():
        names = _named(value) if isinstance(value, list) else None
        if names is not None:
            yield f"{owner}'s {field}", names  # their order
            for name, item in zip(names, value, strict=True):
                yield f"{owner}'s {_singular(field)} {name}", item
        elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            for key, item in value.items():
                yield f"{owner}'s {_singular(field)} {key}", item
        else:
            yield f"{owner}'s {field}", value


def _value_lines(desired: DesiredState) -> Iterable[tuple[str, Any]]:
    for f in dataclasses.fields(desired):
        if f.name in _OWN_PART:
            continue
        value = getattr(desired, f.name)
        if f.name == "recipes":
            for name, recipe in sorted(value.items()):
                yield f"recipe {name}", recipe
                yield from _model_lines(f"recipe {name}", jsonable(recipe))
        elif f.name == "host":
            yield from _model_lines(_WORDS["host"], jsonable(value))
        elif f.name == "manifest_path" and desired.source_commit and isinstance(value, str):
            # The commit's label (COMMIT:PATH) is the source part's: the file's own path here.
            yield _WORDS[f.name], value.split(":", 1)[-1]
        else:
            yield _WORDS.get(f.name, f"the manifest's {f.name}"), value


def desired_lines(desired: DesiredState) -> list[str]:
    """Pure: the desired state as sorted lines ``WORDS sha256:DIGEST``, one per field (a recipe and the host file
    one per top-level field, and per probe, per slot...), each a digest of the value's canonical JSON."""
    return sorted(f"{words}{_SEP}{digest(value)}" for words, value in _value_lines(desired))


def source_lines(desired: DesiredState) -> list[str]:
    """Pure: where the desired state was read from: the commit in use of the git source, or the root's files."""
    return [f"commit {desired.source_commit}" if desired.source_commit else LOCAL]


def _keyed(lines: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        words, _, dig = line.rpartition(_SEP)
        out[words or line] = dig
    return out


def desired_changes(before: Mapping[str, list[str]], now: Mapping[str, list[str]]) -> list[str]:
    """Pure: how the desired state (``desired``, ``source`` parts of two fingerprints) differs, in words: what was
    added, removed or changed, the most precise words only ("recipe omni's probe smoke changed", not also "recipe
    omni changed"); a move of the git source heads them ("the git source moved from 2649ad3 to 4910b38: ...")."""
    old, new = _keyed(before.get("desired") or ()), _keyed(now.get("desired") or ())
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    changed = [k for k in new if k in old and old[k] != new[k]]
    whole = [*added, *removed]
    words = [f"{k} added" for k in added if not _inside(k, whole)]
    words += [f"{k} removed" for k in removed if not _inside(k, whole)]
    words += [
        f"{k} changed" for k in changed if not _inside(k, whole) and not _refined(k, changed) and not _counted(k, whole)
    ]
    words.sort()
    head = _source_moved(before.get("source") or [], now.get("source") or [])
    if head is None:
        return words
    return [f"{head}: {'; '.join(words) if words else 'nothing this host reads changed'}"]


def _inside(key: str, keys: list[str]) -> bool:
    """Whether ``key`` is a part of another key of ``keys`` (recipe omni's drain, of recipe omni)."""
    return any(key.startswith(f"{k}'s ") for k in keys if k != key)


def _counted(key: str, keys: list[str]) -> bool:
    """Whether ``key`` is a list of named things (recipe omni's probes) one of which ``keys`` adds or removes
    (recipe omni's probe smoke): its order changed with it, said once."""
    owner, _, field = key.partition("'s ")
    return bool(field) and any(k.startswith(f"{owner}'s {_singular(field)} ") for k in keys)


def _refined(key: str, keys: list[str]) -> bool:
    """Whether a more precise key of ``keys`` says what of ``key`` changed."""
    return any(k.startswith(f"{key}'s ") for k in keys if k != key)


def _source_moved(before: list[str], now: list[str]) -> str | None:
    if before == now:
        return None

    def where(lines: list[str]) -> str | None:
        line = lines[0] if lines else ""
        return line.removeprefix("commit ")[:7] if line.startswith("commit ") else None

    old, new = where(before), where(now)
    if old and new:
        return f"the git source moved from {old} to {new}"
    if new:
        return f"the desired state now comes from the git source at {new} (before: {LOCAL})"
    if old:
        return f"the desired state now comes from {LOCAL} (before: the git source at {old})"
    return None
