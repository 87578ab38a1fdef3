"""pydantic's validation errors as the loader's problems: each names the field as the operator wrote it, what is
wrong, the keys allowed where an unknown one was given, and the fix; an env value (maybe a secret) is never shown.

Called by the readers of the host file, recipes and manifests (``reconciler.load.yaml_source``, ``.recipes``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from reconciler.base.errors import ConfigProblem


def _allowed_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str] | None:
    """The keys a model accepts at ``loc`` (for 'unknown key' messages)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = _unwrap(field.annotation)
        else:
            return None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/list/dict to the model type inside, if any."""
    origin = get_origin(annotation)
    if origin is None:
        return annotation
    for arg in reversed(get_args(annotation)):
        inner = _unwrap(arg)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return annotation


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
_TABLE_NAMED = re.compile(r"\[([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)\]", re.ASCII)


def _field_name(loc: Sequence[Any]) -> str:
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
            continue
        part = str(p) if _PLAIN_KEY.fullmatch(str(p)) else repr(str(p))  # a key as odd as '\n' or '' stays visible
        out += f".{part}" if out else part
    return out or "(top level)"


def _unquoted(kind: str, got: Any) -> str | None:
    """A value written in quotes where the file models want a number or a boolean (their types are strict), as
    it is written without them; None when it is no such value."""
    if not isinstance(got, str):
        return None
    text = got.strip()
    if kind == "bool_type" and text.lower() in ("true", "false"):
        return text.lower()
    try:
        if kind == "int_type" and str(int(text)):
            return str(int(text))
        if kind == "float_type" and math.isfinite(float(text)):
            return text
    except ValueError:
        return None
    return None


def problems_from(
    exc: ValidationError, *, path: str, model: type[BaseModel], line_of: Any, what: str
) -> list[ConfigProblem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = _field_name(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(model, loc[:-1])
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            msg = f"{field}: unknown key {short(loc[-1])} in {what}{hint}. Remove it or fix its spelling"
        elif kind == "missing":
            msg = f"{field}: required key is missing in {what}. Add it"
        else:
            text = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None or repr(got) in text else f" (got {short(got)})"
            bare = _unquoted(kind, got)
            if bare is not None:
                sep = " = " if what == "a recipe" else ": "
                shown += f"; a number or boolean is written without quotes: {loc[-1]}{sep}{bare}"
            if "env" in loc:
                shown = ""  # an env value may be a secret: the message names the key, never the value
            msg = f"{text}{shown}" if text.startswith(field) else f"{field}: {text}{shown}"
            table = _TABLE_NAMED.match(text) if not loc else None
            if table:
                # A check of the whole model that names its table ("[sleep] needs ..."): that table's line, and the
                # message as it is, never "(top level)".
                problems.append(ConfigProblem(path, line_of(tuple(table.group(1).split("."))), f"{text}{shown}"))
                continue
        problems.append(ConfigProblem(path, line_of(loc), msg))
    return problems


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
