"""Golden files of the outside surface (tests/data/golden/): what a test observed is compared with what was recorded,
and a difference fails with a unified diff and the command that records the new surface on purpose.

``GOLDEN_UPDATE=1 pytest tests/contract`` rewrites the golden files instead of comparing (never the default): run it
only when a change of the surface is meant, and commit the new files with the change that made them.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"


def check(name: str, text: str) -> None:
    """``text`` is the golden file ``name`` byte for byte (written instead with GOLDEN_UPDATE=1)."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        return
    how = f"if the change is meant: GOLDEN_UPDATE=1 pytest {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}"
    if not path.exists():
        pytest.fail(f"no golden file {path.relative_to(GOLDEN.parent.parent.parent)}: record it with {how}")
    want = path.read_text(encoding="utf-8")
    if want != text:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"golden/{name}",
                tofile="observed",
            )
        )
        pytest.fail(f"the surface changed from tests/data/golden/{name}:\n{diff}\n{how}", pytrace=False)


def check_json(name: str, data: Any) -> None:
    """``data`` as sorted, indented JSON is the golden file ``name``."""
    check(name, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def check_lines(name: str, lines: Any) -> None:
    """The sorted set of ``lines``, one a line, is the golden file ``name``."""
    check(name, "".join(f"{line}\n" for line in sorted(set(lines))))


def key_paths(data: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: ``actions[].kind`` for the key ``kind`` of any object in the list
    ``actions`` (the objects of a list merged), ``error.code`` for a nested object's key. Values are left out;
    a list of scalars or an empty list is its own path (``args[]``)."""
    out: set[str] = set()
    if isinstance(data, dict):
        for k, v in data.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.add(p)
            out |= key_paths(v, p)
    elif isinstance(data, list):
        p = f"{prefix}[]"
        out.add(p)
        for v in data:
            out |= key_paths(v, p)
    return out
