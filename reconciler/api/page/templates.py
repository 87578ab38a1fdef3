"""The page's templates, escaped by construction: ``render(name, **values)`` fills a ``string.Template`` file of
``templates/`` (package data) with every value HTML-escaped (quotes included, so a value is safe inside a quoted
attribute), except an ``Html`` value, which is markup this module made already (another template's output, or
``join`` of such). A value can reach the page only through ``esc``: there is no way to put text in unescaped.

Why not Jinja2: the page has a dozen small templates whose loops and conditions read better in Python than in a
template language, and the standard library's ``string.Template`` and ``html.escape`` give the one property that
matters here (autoescaping) without a new dependency in the listener of a root process.

Used by ``reconciler.api.page.view`` and ``reconciler.api.page.sections``.
"""

from __future__ import annotations

import functools
import html
import string
from collections.abc import Iterable
from importlib import resources
from typing import Any


class Html(str):
    """Markup made by ``render``, ``join`` or ``esc``: put into another template as it is."""

    __slots__ = ()


def esc(value: Any) -> Html:
    """``value`` as text safe anywhere in the page's markup (None is empty)."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("")
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Html:
    """Several pieces, each escaped unless it is ``Html`` already."""
    return Html(sep.join(esc(p) for p in parts))


@functools.cache
def _template(name: str) -> string.Template:
    text = resources.files("reconciler.api.page").joinpath("templates", name).read_text(encoding="utf-8")
    return string.Template(text)


def render(name: str, **values: Any) -> Html:
    """The template ``templates/NAME`` with every ``$key`` replaced by ``esc(value)``; a key missing is a KeyError
    (a template and its caller out of step fail the tests, never show a literal ``$key``)."""
    return Html(_template(name).substitute({k: esc(v) for k, v in values.items()}))


@functools.cache
def static_file(name: str) -> bytes:
    """A file of ``static/`` (package data), read once."""
    return resources.files("reconciler.api.page").joinpath("static", name).read_bytes()
