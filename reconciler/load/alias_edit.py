"""``reconciler promote ALIAS RECIPE``'s edit of a manifest: the recipe one alias of its top-level ``aliases:`` names
replaced, every other byte of the file kept (comments, order, quoting, the alias's gates), so a GitOps diff shows one
line. The short form (``NAME: RECIPE``) has its value replaced, the long form (``NAME: {recipe: RECIPE, gates:
...}``, block or flow) its ``recipe:`` value.

Pure: text in, text out, the nodes found by YAML's own parser (``yaml.compose``), as ``load.topology_edit`` finds
``topology:``. Called by the service's promotion; the write (atomic, under the lock of the host's manifest edits,
refused when the file changed since it was read) is the caller's.
"""

from __future__ import annotations

from typing import Any

import yaml

from reconciler.base.requests import RECIPE
from reconciler.load.topology_edit import TopologyEditError


class AliasEditError(TopologyEditError):
    """The manifest cannot be promoted by editing the alias's recipe; the message says why and what to do."""


def alias_recipe_of(text: str, alias: str) -> str | None:
    """The recipe ``alias`` names in ``text`` (None without that alias); AliasEditError when the text is not one
    YAML mapping."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AliasEditError(f"the manifest is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise AliasEditError("the manifest is not a YAML mapping at its top level")
    return _target(data.get("aliases"), alias)


def _target(aliases: Any, alias: str) -> str | None:
    if not isinstance(aliases, dict):
        return None
    value = aliases.get(alias)
    if isinstance(value, dict):
        value = value.get("recipe")
    return value if isinstance(value, str) else None


def _one(node: yaml.MappingNode, key: str, what: str) -> yaml.Node | None:
    found = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key]
    if len(found) > 1:
        raise AliasEditError(f"{what} has {key!r} twice: keep one")
    return found[0] if found else None


def set_alias_recipe(text: str, alias: str, recipe: str) -> str:
    """``text`` with the recipe ``alias`` names replaced by ``recipe``.

    Refused (``AliasEditError``) when ``recipe`` is not a recipe name, when the text is not one YAML mapping, when it
    has no top-level ``aliases:`` holding ``alias``, or when the value to replace is not a plain one-line scalar (an
    anchor, an alias, a tag or a block scalar is left for a person to edit).
    """
    if not RECIPE.fullmatch(recipe):
        raise AliasEditError(f"{recipe!r} is not a recipe name: lower-case letters, digits, '.', '_' and '-'")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise AliasEditError(f"the manifest is not valid YAML: {exc}") from None
    if not isinstance(root, yaml.MappingNode):
        raise AliasEditError("the manifest is not a YAML mapping at its top level")
    aliases = _one(root, "aliases", "the manifest's top level")
    if not isinstance(aliases, yaml.MappingNode):
        raise AliasEditError("the manifest has no top-level 'aliases:' mapping: add the alias by hand")
    value = _one(aliases, alias, "aliases:")
    if value is None:
        raise AliasEditError(f"aliases: has no {alias!r}: add it by hand")
    if isinstance(value, yaml.MappingNode):
        value = _one(value, "recipe", f"aliases.{alias}")
        if value is None:
            raise AliasEditError(f"aliases.{alias} has no 'recipe:'")
    if not isinstance(value, yaml.ScalarNode) or value.tag != "tag:yaml.org,2002:str":
        raise AliasEditError(f"aliases.{alias}'s recipe must be a plain name (a string): edit it by hand")
    start, end = value.start_mark.index, value.end_mark.index
    written = text[start:end]
    if value.style in ("|", ">") or "\n" in written or written.startswith(("&", "*", "!")):
        raise AliasEditError(
            f"aliases.{alias}'s recipe must be a one-line name without an anchor, alias or tag: edit it by hand"
        )
    quote = value.style if value.style in ("'", '"') else ""
    if not quote and not isinstance(yaml.safe_load(recipe), str):
        quote = '"'  # a plain `yes`, `null` or `1.5` would read back as no string
    out = f"{text[:start]}{quote}{recipe}{quote}{text[end:]}"
    _check(text, out, alias, recipe)
    return out


def _check(before: str, after: str, alias: str, recipe: str) -> None:
    """The edit reads back as intended: the alias names ``recipe``, and nothing else of the document changed."""
    old, new = yaml.safe_load(before), yaml.safe_load(after)
    if not isinstance(new, dict) or _target(new.get("aliases"), alias) != recipe:
        raise AliasEditError("the edited manifest does not read back with the new recipe: edit it by hand")
    entry = old["aliases"][alias]
    old["aliases"][alias] = {**entry, "recipe": recipe} if isinstance(entry, dict) else recipe
    if old != new:
        raise AliasEditError("the edit would change more than the alias's recipe: edit it by hand")
