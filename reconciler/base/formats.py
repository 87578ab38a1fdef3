"""The format version of each file the tool keeps, so that the next release reads it (docs/design.md, "What a release
reads of the last one's").

A JSON object the tool writes (a record under the state directory, a line of the audit trail or the ownership log,
the loop's published state) carries ``FORMAT_KEY``: the version of its format. A release reads its own version and
every older one; an object without the key is version 1 (written before the key was); one of a newer version is
refused, naming both versions. A format changes its version only where an older release would misread it: a key
added that an older release may ignore keeps it. The saved plan's ``format`` and the containers' hash-version label
(``reconciler.plan.observed``) are the same rule for their own values.

Standard library only: called by ``reconciler.store`` (``state``, ``audit``, ``loop_state``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FORMAT_KEY = "_format_version"  # never a recipe's name, a container's id or a slot: none starts with "_"


def stamped(data: Mapping[str, Any], version: int) -> dict[str, Any]:
    """``data`` with its format version."""
    return {FORMAT_KEY: version, **{k: v for k, v in data.items() if k != FORMAT_KEY}}


def unstamped(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without its format version: what its readers and the outputs see."""
    return {k: v for k, v in data.items() if k != FORMAT_KEY}


def format_problem(data: Mapping[str, Any], *, reads: int) -> str | None:
    """Why a release that reads formats 1 to ``reads`` cannot read ``data``; None when it can (no key: format 1)."""
    version = data.get(FORMAT_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return f"its format version {version!r} is no version this reconciler knows"
    if version > reads:
        return (
            f"it was written by a newer reconciler (format version {version}; this one reads up to {reads}): "
            "run that release, or the newer one again"
        )
    return None
