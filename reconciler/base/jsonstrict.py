"""JSON from clients, read strictly: one place for the HTTP API, MCP over HTTP and MCP over stdio.

``{"confirm": false, "confirm": true}`` is no confirmation: a duplicate key is refused (Python's json keeps the last
one, and so did every front-end). Nesting deeper than ``MAX_DEPTH`` is refused before parsing (deep enough, it ended
the parser with RecursionError, answered as a 500). Pure, standard library only.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32  # the deepest legitimate body (an MCP call with its arguments) is 4 deep


class StrictJsonError(ValueError):
    """Not JSON, a duplicate key, or too deep: the message is for the client."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJsonError(f"the key {k!r} appears twice in one object; give each key once")
        out[k] = v
    return out


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def depth(raw: bytes) -> int:
    """How deep ``raw`` nests arrays and objects (strings skipped), without parsing it."""
    level = deepest = 0
    for c in _STRINGS.sub(b"", raw):
        if c in b"[{":
            level += 1
            deepest = max(deepest, level)
        elif c in b"]}":
            level -= 1
    return deepest


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``raw`` as JSON; StrictJsonError when it is not JSON, holds a duplicate key or nests past ``max_depth``."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if depth(data) > max_depth:
        raise StrictJsonError(f"the JSON nests deeper than {max_depth} levels")
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates)
    except StrictJsonError:
        raise
    except (ValueError, RecursionError):
        raise StrictJsonError("not JSON") from None
