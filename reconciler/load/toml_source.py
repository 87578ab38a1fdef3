"""TOML text and the lines of its keys: a pydantic error's location or a duplicate key found back as the line it
was written on (best effort: tomllib gives no positions), and tomllib's syntax errors as the loader's problems.

Called by the recipe reader (``reconciler.load.recipes``) and the cross-checks that point into a recipe.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from typing import Any

from reconciler.base.errors import ConfigProblem

_TOML_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_TOML_DOTTED = rf"{_TOML_KEY_PART}(?:\s*\.\s*{_TOML_KEY_PART})*"
_TOML_HEADER = re.compile(rf"^\s*\[\[?\s*({_TOML_DOTTED})\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(rf"^\s*({_TOML_DOTTED})\s*=")


def _toml_parts(dotted: str) -> tuple[str, ...]:
    return tuple(p.strip().strip("\"'") for p in re.findall(_TOML_KEY_PART, dotted))


def _toml_keys(text: str) -> list[tuple[int, tuple[str, ...], bool]]:
    """(line, full key path, is a table header) for each key or table header line of TOML text (best effort)."""
    table: tuple[str, ...] = ()
    out: list[tuple[int, tuple[str, ...], bool]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        m = _TOML_HEADER.match(raw)
        if m:
            table = _toml_parts(m.group(1))
            out.append((n, table, True))
            continue
        k = _TOML_KEY.match(raw)
        if k:
            out.append((n, (*table, *_toml_parts(k.group(1))), False))
    return out


def toml_line(text: str, loc: Sequence[Any]) -> int | None:
    """The line of a key in TOML text: ``loc`` like ('container', 'image'); tables by their header."""
    where: dict[tuple[str, ...], int] = {}
    for n, path, _ in _toml_keys(text):
        where.setdefault(path, n)
    parts = tuple(str(p) for p in loc if not isinstance(p, int))
    for i in range(len(parts), 0, -1):
        if parts[:i] in where:
            return where[parts[:i]]
    return None


def _toml_first_line_of(text: str, line: int) -> int | None:
    """For a key or table given twice: the earlier line that first gave the one at ``line``."""
    keys = _toml_keys(text)
    at = [path for n, path, _ in keys if n == line]
    if not at:
        return None
    for n, path, _ in keys:
        if n < line and path == at[0]:
            return n
    for n, path, _ in keys:  # a key that a later table header (or dotted key) tries to redefine as a table
        if n < line and path[: len(at[0])] == at[0]:
            return n
    return None


def toml_problem(rel: str, text: str, exc: tomllib.TOMLDecodeError) -> ConfigProblem:
    msg = str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg) or re.search(r"\s*\(at line (\d+)\)$", msg)
    line = int(m.group(1)) if m else None
    if m is None:
        m2 = re.search(r"\(at end of document\)$", msg)
        line = len(text.splitlines()) or 1 if m2 else None
    detail = msg[: m.start()] if m else msg
    if m and m.lastindex == 2:
        detail += f" (column {m.group(2)})"
    if any(w in msg for w in ("Cannot overwrite", "Cannot declare", "Cannot mutate", "Duplicate")):
        fix = "A key may be given once per table: remove one of them"
        found = _duplicate(text, int(m.group(1)) if m else None)  # "at end of document" names no line of it
        if found is not None:
            at, first, what = found
            return ConfigProblem(rel, at, f"duplicate key: {what} given at line {first} and again at line {at}. {fix}")
        if line:
            earlier = _toml_first_line_of(text, line)
            where = f"; it was first given at line {earlier}" if earlier else ""
            return ConfigProblem(rel, line, f"duplicate key: {_tuples_as_tables(detail)}{where}. {fix}")
    return ConfigProblem(rel, line, f"TOML syntax error: {detail}")


def _duplicate(text: str, near: int | None) -> tuple[int, int, str] | None:
    """The key or table given twice in TOML text, by its lines: (its line, the line that first gave it, what it is in
    words: "key 'model.id'", "table [model]"), the one on tomllib's line ``near`` where it gave one; a table header
    over a table that a dotted key already made counts too, and each ``[[array]]`` element starts afresh. None when
    the scan (best effort: one line per key) finds none."""
    seen: dict[tuple[str, ...], tuple[int, bool]] = {}
    table: tuple[str, ...] = ()
    found: list[tuple[int, int, str]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if m := _TOML_HEADER.match(raw):
            table = _toml_parts(m.group(1))
            name = ".".join(table)
            if raw.lstrip().startswith("[["):  # a new element of an array of tables: its keys are its own
                seen = {p: v for p, v in seen.items() if p[: len(table)] != table}
                continue
            if table in seen:
                found.append((n, seen[table][0], f"table [{name}]"))
            made = [ln for p, (ln, hdr) in seen.items() if not hdr and len(p) > len(table) and p[: len(table)] == table]
            if made and table not in seen:
                found.append((n, made[0], f"table [{name}] (a dotted key made it already)"))
            seen.setdefault(table, (n, True))
        elif k := _TOML_KEY.match(raw):
            path = (*table, *_toml_parts(k.group(1)))
            if path in seen:
                found.append((n, seen[path][0], f"key '{'.'.join(path)}'"))
            seen.setdefault(path, (n, False))
    return next((f for f in found if f[0] == near), None) if near else (found[0] if found else None)


def _tuples_as_tables(detail: str) -> str:
    """tomllib's "Cannot declare ('model',) twice" as words: "Cannot declare [model] twice"."""
    return re.sub(
        r"\(((?:'[^']*',?\s*)+)\)", lambda m: "[" + ".".join(re.findall(r"'([^']*)'", m.group(1))) + "]", detail
    )
