"""configs/recipes/NAME.toml read into ``Recipe``s: each file's name checked, its TOML parsed and validated, the
server's own tensor parallel flag held to the recipe's, and the ports a lane uses on the host's network.

Called by ``reconciler.load.desired`` and the service (``load_recipes``); the cross-checks read ``host_ports`` and
``recipe_line``.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.load.files import RECIPES_DIR, check_root, read_text, rel_path, remember
from reconciler.load.problems import problems_from
from reconciler.load.toml_source import toml_line, toml_problem
from reconciler.model import Recipe, check_name

_RECIPES: dict[str, Recipe] = {}  # a recipe's TOML text -> its validated recipe (files.remember says why)


def load_recipe(root: Path, path: Path) -> Recipe:
    rel = rel_path(root, path)
    text = read_text(root, path, "a recipe")
    known = _RECIPES.get(text)
    if known is not None:
        return known
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([toml_problem(rel, text, exc)]) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, "TOML nested too deeply to read; flatten it")]) from None
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            problems_from(exc, path=rel, model=Recipe, line_of=lambda loc: toml_line(text, loc), what="a recipe")
        ) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, "the recipe is nested too deeply; flatten it")]) from None
    problem = _command_tp_problem(recipe)
    if problem:
        raise ConfigError([ConfigProblem(rel, toml_line(text, ("container", "command")), problem)])
    remember(_RECIPES, text, recipe)
    return recipe


def _argv_words(recipe: Recipe) -> list[str]:
    """The words of the recipe's program and arguments; an argument holding spaces (``sh -c "vllm serve ..."``)
    split as a shell would, where it can be."""
    words: list[str] = []
    for arg in [*(recipe.container.entrypoint or ()), *recipe.container.command]:
        if any(c.isspace() for c in arg):
            try:
                words.extend(shlex.split(arg))
                continue
            except ValueError:
                pass
        words.append(arg)
    return words


def command_flag(words: Sequence[str], *names: str) -> tuple[str, str] | None:
    """(the flag as written, its value) of the last of ``names`` given in ``words`` (``--flag V``, ``--flag=V``),
    as argparse reads a flag given twice; None when none is given."""
    found: tuple[str, str] | None = None
    for i, w in enumerate(words):
        for name in names:
            if w == name and i + 1 < len(words):
                found = (f"{name} {words[i + 1]}", words[i + 1])
            elif w.startswith(name + "="):
                found = (w, w[len(name) + 1 :])
    return found


def _command_tp_problem(recipe: Recipe) -> str | None:
    """The server's own --tensor-parallel-size (or -tp) against the recipe's tensor_parallel_size: a lane given
    fewer GPU slots than its server shards over fails at start (or runs on cards it was not given)."""
    flag = command_flag(_argv_words(recipe), "--tensor-parallel-size", "-tp")
    if flag is None:
        return None
    written, value = flag
    tp = recipe.tensor_parallel_size
    if value.strip().isdigit() and int(value) == tp:
        return None
    return (
        f"container.command: the server is told {written}, but the recipe has tensor_parallel_size = {tp} (the GPU "
        f"slots an assignment gives it); make them agree: tensor_parallel_size = {value} or "
        f"--tensor-parallel-size {tp}"
    )


def host_ports(recipe: Recipe) -> list[tuple[int, str]]:
    """(port, where it is said) of every port the lane listens on or is asked at, on the host's network: its
    command's --port and the ports of its health, probe and drain URLs. None for a lane off the host's network."""
    if recipe.container.network != "host":
        return []
    out: list[tuple[int, str]] = []
    flag = command_flag(_argv_words(recipe), "--port")
    if flag is not None and flag[1].strip().isdigit():
        out.append((int(flag[1]), f"its command's {flag[0]}"))
    urls = [("health.url", recipe.health.url), ("drain.metrics_url", recipe.drain.metrics_url)]
    urls += [(f"probes {p.name!r} base_url", p.base_url) for p in recipe.probes]
    for what, url in urls:
        if url:
            u = urlsplit(url)
            try:
                port = u.port or (443 if u.scheme == "https" else 80)
            except ValueError:
                continue
            out.append((port, f"its {what} {url}"))
    return out


def load_recipes(root: Path) -> dict[str, Recipe]:
    check_root(root)
    return read_recipes(root)


def read_recipes(root: Path) -> dict[str, Recipe]:
    """Every recipe of a root already checked (``load_recipes`` checks it first); one ConfigError with all problems."""
    rdir = root / RECIPES_DIR
    recipes: dict[str, Recipe] = {}
    problems: list[ConfigProblem] = []
    if not rdir.is_dir():
        raise ConfigError([ConfigProblem(RECIPES_DIR, None, "directory not found: add one NAME.toml per recipe")])
    for path in sorted(rdir.glob("*.toml")):
        name = path.stem
        if check_name(name, "recipe name"):
            problems.append(
                ConfigProblem(
                    rel_path(root, path),
                    None,
                    f"recipe name {name!r} (the file stem) must match [a-z0-9][a-z0-9._-]* (lowercase, at most 128 "
                    "characters): it becomes part of container names. Rename the file",
                )
            )
            continue
        try:
            recipes[name] = load_recipe(root, path)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return recipes


def recipe_file(name: str) -> str:
    return f"{RECIPES_DIR}/{name}.toml"


def recipe_line(root: Path, name: str, loc: Sequence[Any]) -> int | None:
    """The line of ``loc`` in recipe ``name``'s file, for a problem found after it was read; None if unreadable."""
    try:
        return toml_line((root / RECIPES_DIR / f"{name}.toml").read_text(encoding="utf-8"), loc)
    except (OSError, UnicodeDecodeError):
        return None
