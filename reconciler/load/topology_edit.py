"""``reconciler switch NAME``'s edit of a manifest: the value of its top-level ``topology:`` key replaced, every
other byte of the file kept (comments, order, quoting, line ends), so a GitOps diff shows one line.

Pure: text in, text out. The key is found by YAML's own parser (``yaml.compose``: the node and the marks of where its
value starts and ends in the text), never by a pattern over lines, so a ``topology:`` inside a comment, a block
scalar or a nested map is never taken for it. Called by the service's switch; the write (atomic, under the lock of
the host's manifest edits, refused when the file changed since it was read) is the caller's.
"""

from __future__ import annotations

import re

import yaml

# A topology's name as the manifest's schema allows it; also what may be written unquoted as a plain YAML scalar.
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class TopologyEditError(ValueError):
    """The manifest cannot be switched by editing its ``topology:`` value; the message says why and what to do."""


def topology_of(text: str) -> str | None:
    """The value of the top-level ``topology:`` of ``text`` (None without one); TopologyEditError when the text is
    not one YAML mapping."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyEditError(f"the manifest is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise TopologyEditError("the manifest is not a YAML mapping at its top level")
    value = data.get("topology")
    return value if isinstance(value, str) else None


def set_topology(text: str, name: str) -> str:
    """``text`` with the value of its top-level ``topology:`` key replaced by ``name``.

    Refused (``TopologyEditError``) when ``name`` is not a topology name, when the text is not one YAML mapping,
    when it has no top-level ``topology:`` key (or has it twice), or when its value is not a plain one-line
    scalar (an anchor, an alias, a tag or a block scalar is left for a person to edit).
    """
    if not NAME.match(name):
        raise TopologyEditError(
            f"{name!r} is not a topology name: lower-case letters, digits, '.', '_' and '-', at most 63"
        )
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise TopologyEditError(f"the manifest is not valid YAML: {exc}") from None
    if not isinstance(root, yaml.MappingNode):
        raise TopologyEditError("the manifest is not a YAML mapping at its top level")
    found = [(k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "topology"]
    if not found:
        raise TopologyEditError(
            "the manifest has no top-level 'topology:' key: add 'topology: NAME' beside 'topologies:' to switch"
        )
    if len(found) > 1:
        raise TopologyEditError("the manifest has 'topology:' twice at its top level: keep one")
    _key, value = found[0]
    if not isinstance(value, yaml.ScalarNode) or value.tag != "tag:yaml.org,2002:str":
        raise TopologyEditError("'topology:' must be a plain name (a string), not a list, a map, a number or null")
    start, end = value.start_mark.index, value.end_mark.index
    written = text[start:end]
    if value.style in ("|", ">") or "\n" in written or written.startswith(("&", "*", "!")):
        raise TopologyEditError("'topology:' must be a one-line name without an anchor, alias or tag: edit it by hand")
    quote = value.style if value.style in ("'", '"') else ""
    if not quote and not isinstance(yaml.safe_load(name), str):
        quote = '"'  # a plain `yes`, `null` or `1.5` would read back as no string
    out = f"{text[:start]}{quote}{name}{quote}{text[end:]}"
    _check(out, name)
    return out


def _check(text: str, name: str) -> None:
    """The edit reads back as intended: the same keys, and ``topology`` holding ``name``."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or data.get("topology") != name:
        raise TopologyEditError("the edited manifest does not read back with the new topology: edit it by hand")
