"""Small pieces of markup, escaped by construction: ``el`` (one element, its attributes and its content escaped
unless ``Html``), ``dl_pairs``, ``table`` and the figures' words (``size``, ``ago``).

Used by ``reconciler.api.page.view`` and ``reconciler.api.page.sections``; the larger pieces are templates
(``reconciler.api.page.templates``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from reconciler.api.page.templates import Html, esc, join

_VOID = frozenset({"input", "br"})


def el(tag: str, *content: Any, **attrs: Any) -> Html:
    """``<tag attrs>content</tag>``; an attribute named with a trailing ``_`` (``class_``) loses it, ``data_x``
    becomes ``data-x``; an attribute whose value is None or False is left out, True is written bare."""
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        parts.append(name if value is True else f'{name}="{esc(value)}"')
    head = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Html(head)
    return Html(head + join(content) + f"</{tag}>")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], **attrs: Any) -> Html:
    """A table of ``rows`` (each cell escaped unless ``Html``); an empty one says so."""
    body = [el("tr", *(el("td", c) for c in row)) for row in rows]
    if not body:
        return el("p", "none", class_="none")
    head = el("thead", el("tr", *(el("th", h) for h in headers)))
    return el("table", head, el("tbody", *body), **attrs)


def size(n: Any) -> str:
    """Bytes in words: 3.0 GiB, 512 MiB, 12 KiB; unknown for None."""
    if not isinstance(n, int | float) or isinstance(n, bool):
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def ago(at: Any, *, now: float | None = None) -> str:
    """An epoch time as an age: 4 s ago, 3 min ago."""
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "never"
    age = max(0.0, (now if now is not None else time.time()) - float(at))
    if age < 120:
        return f"{age:.0f} s ago"
    if age < 7200:
        return f"{age / 60:.0f} min ago"
    return f"{age / 3600:.1f} h ago"
