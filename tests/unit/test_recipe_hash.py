"""A release that adds a recipe key moves no hash (docs/design.md, "The recipe's hash across releases").

The recipe model is extended here as a later release would extend it (a subclass with more keys, each with a
default; recipe.py untouched), and every recipe the repository ships, and the golden one, must hash and render
exactly as before. The hash as it was before hash versions (the whole dump, defaults included) is kept here as
``_dump_hash`` to show the test tells the two apart. A changed default (a migration) is played with a
``DefaultChange`` of the test's own.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field, create_model

from reconciler.model import ContainerSpec, HostConfig, Recipe, StopSpec
from reconciler.model import recipe_hash as rh
from reconciler.plan import spec

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden" / "recipe-hash"


def _toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def _is_recipe(path: Path) -> bool:
    try:
        Recipe.model_validate(_toml(path))
    except (ValueError, RecursionError):  # a bad-input case (one nests past any limit), or another kind of file
        return False
    return True


# Every recipe in the repository: the shipped ones, the demo's and the tests' (bad-input cases left out).
SHIPPED = sorted(
    p for d in ("configs", "examples", "tests") for p in (REPO / d).rglob("*.toml") if p.is_file() and _is_recipe(p)
)


# A later release's recipe: a container key, a top-level key, a whole new section and a stop key, each defaulted.
class Tuning(BaseModel):
    model_config = ContainerSpec.model_config
    swap_gib: float = 0
    compile: bool = True


ContainerPlus = create_model(
    "ContainerPlus", __base__=ContainerSpec, cap_add=(list[str], Field(default_factory=list)), pids_limit=(int, 0)
)
StopPlus = create_model("StopPlus", __base__=StopSpec, signal=(str, "SIGTERM"))
RecipePlus = create_model(
    "RecipePlus",
    __base__=Recipe,
    container=(ContainerPlus, ...),
    stop=(StopPlus, Field(default_factory=StopPlus)),
    priority=(int, 0),
    tuning=(Tuning, Field(default_factory=Tuning)),
)


def _dump_hash(recipe: BaseModel) -> str:
    """The hash as it was computed before hash versions: every key, defaults included."""
    dump = recipe.model_dump(mode="json", exclude={k: True for k in rh.NOT_HASHED} | rh.NOT_HASHED_NESTED)
    return hashlib.sha256(json.dumps(dump, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def test_shipped_recipes_are_found() -> None:
    assert len(SHIPPED) >= 20, SHIPPED


def test_golden_hash_and_spec_hash_unchanged() -> None:
    """The golden recipe's hash and its spec hash on card 42 (tests/contract/test_golden_host.py holds them on a real
    engine) from the model alone, so a change of the hash fails here too, without an engine."""
    golden = json.loads((GOLDEN / "golden-fixed.json").read_text())
    r = Recipe.model_validate(_toml(GOLDEN / "golden-fixed.toml"))
    assert r.content_hash() == golden["recipe_hash"] == "0852b3281db0dc45"
    doc = yaml.safe_load((REPO / "examples" / "demo" / "configs" / "host.yaml").read_text())
    doc["gpus"] = {"dark-compute-a": {"index": 42}, "dark-compute-b": {"index": 43}}
    parts = spec.part_hashes(HostConfig.model_validate(doc), r, ("dark-compute-a",))
    assert spec.spec_hash(parts) == golden["spec_hash_on_gpu_42"]


@pytest.mark.parametrize("path", [GOLDEN / "golden-fixed.toml", *SHIPPED], ids=lambda p: str(p.relative_to(REPO)))
def test_a_defaulted_key_moves_no_hash(path: Path) -> None:
    data = _toml(path)
    today, later = Recipe.model_validate(data), RecipePlus.model_validate(data)
    assert today.content_hash() == _dump_hash(today), "hash version 1 is the whole dump, byte for byte"
    assert later.content_hash() == today.content_hash(), "a key added with a default moved the hash"
    # The test tells the rules apart: hashing the defaults, as before, moves this very hash.
    assert _dump_hash(later) != today.content_hash()


def test_a_later_key_counts_when_it_is_not_at_its_default() -> None:
    data = _toml(GOLDEN / "golden-fixed.toml")
    base = Recipe.model_validate(data).content_hash()
    at_default = {**data, "priority": 0, "tuning": {"compile": True}, "stop": {**data["stop"], "signal": "SIGTERM"}}
    assert RecipePlus.model_validate(at_default).content_hash() == base, "written at its default: not hashed"
    moved = set()
    for change in (
        {"priority": 5},
        {"tuning": {"swap_gib": 4}},
        {"container": {**data["container"], "cap_add": ["SYS_PTRACE"]}},
        {"stop": {**data["stop"], "signal": "SIGINT"}},
    ):
        h = RecipePlus.model_validate({**data, **change}).content_hash()
        assert h != base, change
        moved.add(h)
    assert len(moved) == 4
    # Only what differs is hashed: a new section's other keys stay out, so adding one later moves nothing again.
    form = rh.hashed_form(RecipePlus.model_validate({**data, "tuning": {"swap_gib": 4}}))
    assert form["tuning"] == {"swap_gib": 4}


def test_the_v1_keys_are_still_keys() -> None:
    """Keys may be added, never renamed or removed: each key of hash version 1 is still the model's."""

    def paths(model: type[BaseModel], prefix: str = "") -> set[str]:
        out = set()
        for name, field in model.model_fields.items():
            out.add(prefix + name)
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                out |= paths(field.annotation, prefix + name + ".")
        return out

    nested = {f"{k}.{n}" for k, names in rh.NOT_HASHED_NESTED.items() for n in names}
    hashed = {p for p in paths(Recipe) if p.split(".")[0] not in rh.NOT_HASHED and p not in nested}
    assert hashed == set(rh.HASH_V1_KEYS)
    assert rh.hash_version() == 1 + len(rh.DEFAULT_CHANGES)


def test_a_changed_default_is_a_migration() -> None:
    """A release changes stop.timeout_s's default from 240 to 180 (today's): recipes that leave it unwritten hash
    anew, and ``as_of`` gives back the hash the release before labelled their lanes with."""
    change = rh.DefaultChange(2, "stop.timeout_s", 240, 180, "a test's")
    data = _toml(GOLDEN / "golden-fixed.toml")
    unwritten = Recipe.model_validate({**data, "stop": {}})
    written = Recipe.model_validate({**data, "stop": {"timeout_s": 180}})
    before = Recipe.model_validate({**data, "stop": {"timeout_s": 240}})
    assert rh.hash_version((change,)) == 2
    assert rh.changes_since(unwritten, 1, (change,)) == [change]
    assert rh.changes_since(written, 1, (change,)) == [], "a key the operator wrote keeps its value"
    assert rh.changes_since(unwritten, 2, (change,)) == []
    assert rh.content_hash(rh.as_of(unwritten, 1, (change,)), (change,)) == before.content_hash()
    assert rh.content_hash(rh.as_of(written, 1, (change,)), (change,)) == written.content_hash()
    assert "stop.timeout_s defaults to 180 instead of 240" in change.describe()


def test_a_later_keys_changed_default_moves_the_hash() -> None:
    """A key added after version 1 with default 0, its default changed to 100 later: a recipe that leaves it
    unwritten now runs differently, so its hash moves (measured against the default the key was added with)."""
    change = rh.DefaultChange(2, "container.pids_limit", 0, 100, "a test's")
    later = create_model("Later", __base__=ContainerSpec, pids_limit=(int, 100))
    recipe = create_model("RecipeLater", __base__=Recipe, container=(later, ...))
    data = _toml(GOLDEN / "golden-fixed.toml")
    r = recipe.model_validate(data)
    assert rh.content_hash(r, (change,)) != Recipe.model_validate(data).content_hash()
    assert rh.content_hash(rh.as_of(r, 1, (change,)), (change,)) == Recipe.model_validate(data).content_hash()
    r0 = recipe.model_validate({**data, "container": {**data["container"], "pids_limit": 0}})
    assert rh.content_hash(r0, (change,)) == Recipe.model_validate(data).content_hash()


def test_a_later_rendered_setting_at_its_default_moves_no_part() -> None:
    """The same rule for the rendered container's part hashes (the spec-parts label): a setting ``render`` gives
    after hash version 1 moves the runtime part only where it differs from what its default renders to."""
    r = Recipe.model_validate(_toml(GOLDEN / "golden-fixed.toml"))
    doc = yaml.safe_load((REPO / "examples" / "demo" / "configs" / "host.yaml").read_text())
    rendered = spec.render(HostConfig.model_validate(doc), r, ("dark-compute-a",))
    base = spec.rendered_parts(rendered, r.content_hash())
    defaults = {"cap_add": [], "working_dir": None}
    later = {**rendered, "working_dir": None, "host_config": {**rendered["host_config"], "cap_add": []}}
    assert spec.rendered_parts(later, r.content_hash(), later_defaults=defaults) == base
    changed = {**rendered, "host_config": {**rendered["host_config"], "cap_add": ["SYS_PTRACE"]}}
    assert spec.rendered_parts(changed, r.content_hash(), later_defaults=defaults)["runtime"] != base["runtime"]
    workdir = {**rendered, "working_dir": "/srv"}
    assert spec.rendered_parts(workdir, r.content_hash(), later_defaults=defaults)["runtime"] != base["runtime"]
    # Hashing every rendered key, as before, would move the part: the rule is what keeps it.
    assert spec._digest({**rendered["host_config"], "cap_add": []}, 8) != spec._digest(rendered["host_config"], 8)


def test_served_names_move_no_hash() -> None:
    """``[model] served_names`` says how the front door asks the lane, not what runs in it: writing it recreates no
    lane (docs/design.md, the front door)."""
    data = _toml(GOLDEN / "golden-fixed.toml")
    named = {**data, "model": {**data["model"], "served_names": ["coder", "coder-long"]}}
    assert Recipe.model_validate(named).content_hash() == Recipe.model_validate(data).content_hash()
