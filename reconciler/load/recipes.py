"""configs/recipes/NAME.toml read into ``Recipe``s: each file's name checked, its TOML parsed and validated, the
server's own tensor parallel flag held to the recipe's, and the ports a lane uses on the host's network.

Called by ``reconciler.load.desired`` and the service (``load_recipes``); the cross-checks read ``host_ports`` and
``recipe_line``.
"""

from __future__ import annotations

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
from reconciler.model import Recipe, check_name, served_names
from reconciler.model.door import argv_words, command_served_names

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
    found = [
        ConfigProblem(rel, toml_line(text, loc), problem)
        for check in (_command_tp_problem, _command_port_problems, _served_name_problems)
        for loc, problem in _located(check(recipe))
    ]
    if found:
        raise ConfigError(found)
    remember(_RECIPES, text, recipe)
    return recipe


def _argv_words(recipe: Recipe) -> list[str]:
    """The words of the recipe's program and arguments (``reconciler.model.door.argv_words``)."""
    return argv_words([*(recipe.container.entrypoint or ()), *recipe.container.command])


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


def _located(found: str | list[tuple[tuple[Any, ...], str]] | None) -> list[tuple[tuple[Any, ...], str]]:
    """A check's problems as (where in the file, problem); a bare sentence is the command's."""
    if found is None:
        return []
    if isinstance(found, str):
        return [(("container", "command"), found)]
    return found


_ANY_ADDRESS = frozenset({"0.0.0.0", "::", "[::]", ""})


def _asked_urls(recipe: Recipe) -> list[tuple[tuple[Any, ...], str, str]]:
    """(where in the file, what, URL) of every URL the tool asks the lane's server at: health and each probe (a drain's
    metrics_url may be another process's, such as a sidecar exporter, and a drain that finds no answer stops the lane
    without one)."""
    urls: list[tuple[tuple[Any, ...], str, str]] = []
    if recipe.health.url:
        urls.append((("health", "url"), "health.url", recipe.health.url))
    for i, p in enumerate(recipe.probes):
        if p.base_url:
            urls.append((("probes", i, "base_url"), f"probe {p.name!r} base_url", p.base_url))
    return urls


def _command_port_problems(recipe: Recipe) -> list[tuple[tuple[Any, ...], str]]:
    """On the host's network, the server's own --port (and --host) against every URL the tool asks it at: a health
    URL on another port is never answered, and the enter waits out its whole start timeout for it."""
    if recipe.container.network != "host":
        return []  # another network publishes the lane's ports as the engine maps them: nothing to compare here
    words = _argv_words(recipe)
    port_flag = command_flag(words, "--port")
    host_flag = command_flag(words, "--host")
    port = int(port_flag[1]) if port_flag is not None and port_flag[1].strip().isdigit() else None
    bound = host_flag[1].strip().lower() if host_flag is not None else None
    out: list[tuple[tuple[Any, ...], str]] = []
    for loc, what, url in _asked_urls(recipe):
        u = urlsplit(url)
        try:
            asked = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            continue  # the model's own check says what is wrong with it
        if port is not None and asked != port:
            out.append(
                (
                    loc,
                    f"{what} {url} asks port {asked}, but the server is told {port_flag[0] if port_flag else ''}: "
                    f"nothing would answer there; make them agree (port {port} in the URL, or --port {asked})",
                )
            )
        host = (u.hostname or "").lower()
        if _listens_elsewhere(bound, host):
            out.append(
                (
                    loc,
                    f"{what} {url} asks {host}, but the server listens on {bound} only (its command's "
                    f"{host_flag[0] if host_flag else ''}): nothing would answer there; use --host 127.0.0.1 "
                    "(or 0.0.0.0) or ask the address it listens on",
                )
            )
    return out


def _listens_elsewhere(bound: str | None, host: str) -> bool:
    """Whether a server told ``--host bound`` cannot be reached at ``host`` (loopback names count as one)."""
    if bound is None or bound in _ANY_ADDRESS:
        return False
    bound = bound.strip("[]")
    return bound != host and not ("localhost" in (bound, host) and {bound, host} <= {"localhost", "127.0.0.1", "::1"})


def _served_name_problems(recipe: Recipe) -> list[tuple[tuple[Any, ...], str]]:
    """Every probe asks for a model the server answers to: vLLM answers 404 for any other name, and the enter fails
    its preflight after loading the whole model."""
    names = served_names(recipe)
    out: list[tuple[tuple[Any, ...], str]] = []
    said = command_served_names(recipe)
    if said and recipe.model.served_names and list(said) != recipe.model.served_names:
        out.append(
            (
                ("model", "served_names"),
                f"model.served_names {recipe.model.served_names} differs from the command's --served-model-name "
                f"{list(said)}, which is what the server answers to: drop model.served_names or make them equal",
            )
        )
    for i, p in enumerate(recipe.probes):
        if p.kind == "models":
            continue
        asked = p.model or recipe.model.id
        if asked not in names:
            out.append(
                (
                    ("probes", i, "model") if p.model else ("probes", i, "name"),
                    f"probe {p.name!r} asks for model {asked!r}, but the server answers to "
                    f"{', '.join(repr(n) for n in names)} (its command's --served-model-name, else model.served_names, else model.id): set "
                    "the probe's model to one of them",
                )
            )
    return out


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
