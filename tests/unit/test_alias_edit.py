"""The promotion's edit of a manifest (reconciler/load/alias_edit.py): the alias's recipe replaced in the short form
and in both long forms (block and flow), every other byte kept; refused for what a person must edit."""

from __future__ import annotations

import pytest

from reconciler.load.alias_edit import AliasEditError, alias_recipe_of, set_alias_recipe

TEXT = """\
# the aliases clients ask for
host: h
aliases:
  chat: omni   # the champion
  big: {recipe: "a-1", gates: {repeat: 2}}
  deep:
    recipe: 'b-2'  # since 2026-08
    gates:
      reserve_free_gib: 3
  org/model: &x c-3
topology: split
"""


@pytest.mark.parametrize(
    ("alias", "old", "new"),
    [
        ("chat", "chat: omni ", "chat: dsv4 "),
        ("big", '{recipe: "a-1",', '{recipe: "dsv4",'),
        ("deep", "recipe: 'b-2'", "recipe: 'dsv4'"),
    ],
)
def test_the_aliases_recipe_alone_is_replaced(alias: str, old: str, new: str) -> None:
    out = set_alias_recipe(TEXT, alias, "dsv4")
    assert out == TEXT.replace(old, new, 1)
    assert alias_recipe_of(out, alias) == "dsv4"


@pytest.mark.parametrize(
    ("text", "alias", "recipe", "why"),
    [
        (TEXT, "nope", "dsv4", "has no 'nope'"),
        (TEXT, "org/model", "dsv4", "edit it by hand"),
        (TEXT, "chat", "Not A Name", "is not a recipe name"),
        ("host: h\n", "chat", "dsv4", "no top-level 'aliases:'"),
        ("- a\n", "chat", "dsv4", "not a YAML mapping"),
        ("aliases:\n  chat: {gates: {}}\n", "chat", "dsv4", "has no 'recipe:'"),
    ],
)
def test_what_a_person_must_edit_is_refused(text: str, alias: str, recipe: str, why: str) -> None:
    with pytest.raises(AliasEditError, match=why):
        set_alias_recipe(text, alias, recipe)
