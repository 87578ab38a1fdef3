"""YAML files read strictly, and the lines of their fields: a key given twice is an error (PyYAML keeps the last
silently), merge keys are expanded without rewriting the document, aliases are bounded, and a pydantic error's
location is found back as the line it was written on.

Called by ``reconciler.load.host_file`` (configs/host.yaml) and ``reconciler.load.desired`` (manifests/*.yaml).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.load.files import line_col, read_text, rel_path, remember
from reconciler.load.problems import problems_from, short

MAX_YAML_NODES = 20000  # with aliases expanded: a few aliases must not make validation run for hours

_MERGE_TAG = "tag:yaml.org,2002:merge"


def _merged_pairs(node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
    """``node``'s own key/value pairs, then those its merge keys bring (``<<: *base``, ``<<: [*a, *b]``, depth
    first, an earlier source before a later one), read without changing the node. The first pair of a key is the
    one that counts: own keys override merged ones, as YAML's merge key says."""
    own = [(k, v) for k, v in node.value if k.tag != _MERGE_TAG]
    merged: list[tuple[yaml.Node, yaml.Node]] = []
    for k, v in node.value:
        if k.tag == _MERGE_TAG:
            for source in v.value if isinstance(v, yaml.SequenceNode) else [v]:
                if isinstance(source, yaml.MappingNode):
                    merged.extend(_merged_pairs(source))
    return own + merged


def yaml_line(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """The 1-based line of the deepest YAML node found along ``loc`` (a pydantic error location); a key that came
    through a merge key points where it was written."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in _merged_pairs(node):
                if key.value == str(part):
                    # Point at the value for scalars, at the key for mappings/sequences written on the next lines.
                    line = key.start_mark.line + 1
                    node = value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is recorded (PyYAML keeps the last silently),
    and merge keys are expanded without rewriting the document.

    PyYAML's own merge (``flatten_mapping``) rewrites each merged mapping's node in place: a mapping that uses
    ``<<`` and is then reached again through an alias (merged into another, before its own turn came) was seen
    with the merged keys as its own, refused as a "duplicate key", and merged into the other without its own
    overrides (``b: 2`` over a base's ``b: 0`` arrived as 0)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[tuple[Any, int, int]] = []  # (key, first line, second line)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                # '<<: *base' merges; keys written next to it override on purpose. Only mappings merge.
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if not isinstance(source, yaml.MappingNode):
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping",
                            node.start_mark,
                            f"expected a mapping or list of mappings for merging, but found {source.id}",
                            source.start_mark,
                        )
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable: reported below
            if first is not None:
                self.duplicates.append((key, first.start_mark.line + 1, key_node.start_mark.line + 1))
            else:
                seen[key] = key_node
        mapping: dict[Any, Any] = {}
        for key_node, value_node in _merged_pairs(node):
            if key_node.tag == "tag:yaml.org,2002:value":
                key_node.tag = "tag:yaml.org,2002:str"  # a bare '=' key is the string '=', as PyYAML reads it
            key = self.construct_object(key_node, deep=deep)
            try:
                taken = key in mapping
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                ) from None
            if not taken:
                mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


# YAML 1.2 reads 1e30 and 5E-3 as numbers; PyYAML's YAML 1.1 resolver wants a dot in them and gave a string,
# which the file models' strict types would refuse as "not a number" for what the operator wrote as one.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _expanded_size(node: yaml.Node | None) -> int:
    """Nodes in the document with every alias expanded, counted up to just past MAX_YAML_NODES."""
    count = 0
    stack = [node] if node is not None else []
    while stack and count <= MAX_YAML_NODES:
        n = stack.pop()
        count += 1
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))
    return count


def _read_yaml(root: Path, path: Path, what: str = "a YAML file") -> tuple[Any, yaml.Node | None]:
    rel = rel_path(root, path)
    text = read_text(root, path, what)
    parsed = _PARSED.get(text)
    if parsed is not None:
        return parsed
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if _expanded_size(node) > MAX_YAML_NODES:
            raise ConfigError(
                [
                    ConfigProblem(
                        rel,
                        None,
                        f"the document is too large with its aliases (*name) expanded (over {MAX_YAML_NODES} values); "
                        "write the values out instead of nesting aliases",
                    )
                ]
            )
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        msg = f"YAML syntax error: {exc.problem or exc}"
        if exc.context:
            ctx = exc.context_mark
            msg += f" ({exc.context}" + (f" started at line {ctx.line + 1})" if ctx else ")")
        if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in (exc.problem or ""):
            msg += "; YAML tags (!!python/..., !name) are not read here: write a plain value"
        elif "'\\t'" in (exc.problem or ""):
            msg += "; YAML indents with spaces, not tabs"
        raise ConfigError([ConfigProblem(rel, line, msg)]) from None
    except yaml.reader.ReaderError as exc:
        line, col = line_col(text.encode("utf-8", "replace"), exc.position) if exc.position is not None else (None, 0)
        raise ConfigError(
            [ConfigProblem(rel, line, f"YAML cannot hold the character {exc.character!r} (column {col}); remove it")]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"YAML error: {exc}")]) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, "YAML nested too deeply to read; flatten it")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader.duplicates:
        raise ConfigError(
            [
                ConfigProblem(
                    rel,
                    second,
                    f"duplicate key {short(key)}: given at line {first} and again at line {second}; "
                    "YAML would silently keep only the last one. Remove one of them",
                )
                for key, first, second in loader.duplicates
            ]
        )
    remember(_PARSED, text, (data, node))
    return data, node


_PARSED: dict[str, tuple[Any, yaml.Node | None]] = {}  # a YAML text -> its parse (files.remember says why)


def validate_yaml(root: Path, path: Path, model: type[BaseModel], what: str) -> tuple[Any, yaml.Node | None]:
    data, node = _read_yaml(root, path, what)
    rel = rel_path(root, path)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError([ConfigProblem(rel, 1, f"expected a mapping (key: value lines) for {what}, got {got}")])
    try:
        return model.model_validate(data), node
    except ValidationError as exc:
        raise ConfigError(
            problems_from(exc, path=rel, model=model, line_of=lambda loc: yaml_line(node, loc), what=what)
        ) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, f"{what} is nested too deeply; flatten it")]) from None
