"""Loading the operator's files into the model, with errors that name the file, the line, the field and the fix.

Called by every command: ``load_host(root)`` for the shm commands, ``load_desired(root)`` for the rest.
All problems found are collected and raised together as one ``ConfigError``; nothing is acted on unless the
whole desired state is valid.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from reconciler.errors import ConfigError, ConfigProblem
from reconciler.model import GIB, DesiredAssignment, DesiredState, HostConfig, Manifest, Recipe

HOST_FILE = "configs/host.yaml"
RECIPES_DIR = "configs/recipes"
MANIFESTS_DIR = "manifests"


def default_root() -> str:
    return os.environ.get("RECONCILER_ROOT") or os.getcwd()


# ---------------------------------------------------------------- locating fields in source text


def _yaml_lines(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """The 1-based line of the deepest YAML node found along ``loc`` (a pydantic error location)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    # Point at the value for scalars, at the key for mappings/sequences written on the next lines.
                    line = key.start_mark.line + 1
                    node = value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


_TOML_HEADER = re.compile(r"^\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"']+)\s*=")


def _toml_line(text: str, loc: Sequence[Any]) -> int | None:
    """The line of a key in TOML text: ``loc`` like ('container', 'image'); tables by their header."""
    table: tuple[str, ...] = ()
    where: dict[tuple[str, ...], int] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        m = _TOML_HEADER.match(raw)
        if m:
            table = tuple(p.strip().strip("\"'") for p in m.group(1).split("."))
            where.setdefault(table, n)
            continue
        k = _TOML_KEY.match(raw)
        if k:
            where.setdefault((*table, k.group(1).strip("\"'")), n)
    parts = tuple(str(p) for p in loc if not isinstance(p, int))
    for i in range(len(parts), 0, -1):
        if parts[:i] in where:
            return where[parts[:i]]
    return None


# ---------------------------------------------------------------- pydantic errors -> problems


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


def _field_name(loc: Sequence[Any]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _problems_from(
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
            msg = f"{field}: unknown key {loc[-1]!r} in {what}{hint}. Remove it or fix its spelling"
        elif kind == "missing":
            msg = f"{field}: required key is missing in {what}. Add it"
        else:
            text = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
            msg = f"{field}: {text}{shown}"
        problems.append(ConfigProblem(path, line_of(loc), msg))
    return problems


# ---------------------------------------------------------------- files


def _rel(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def _read_yaml(root: Path, path: Path) -> tuple[Any, yaml.Node | None]:
    rel = _rel(root, path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(rel, None, "file not found")]) from None
    except OSError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"cannot read: {exc.strerror}")]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        msg = f"YAML syntax error: {exc.problem or exc}"
        if exc.context:
            ctx = exc.context_mark
            msg += f" ({exc.context}" + (f" started at line {ctx.line + 1})" if ctx else ")")
        raise ConfigError([ConfigProblem(rel, line, msg)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"YAML error: {exc}")]) from None
    return data, node


def _validate_yaml(root: Path, path: Path, model: type[BaseModel], what: str) -> tuple[Any, yaml.Node | None]:
    data, node = _read_yaml(root, path)
    rel = _rel(root, path)
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(rel, 1, f"expected a mapping for {what}, got {type(data).__name__}")])
    try:
        return model.model_validate(data), node
    except ValidationError as exc:
        raise ConfigError(
            _problems_from(exc, path=rel, model=model, line_of=lambda loc: _yaml_lines(node, loc), what=what)
        ) from None


def load_host(root: str | os.PathLike[str]) -> HostConfig:
    r = Path(root)
    path = r / HOST_FILE
    if not path.exists():
        raise ConfigError(
            [ConfigProblem(_rel(r, path), None, f"file not found: is --root {r} the directory holding configs/?")]
        )
    host, _ = _validate_yaml(r, path, HostConfig, "the host file")
    return host


def load_recipe(root: Path, path: Path) -> Recipe:
    rel = _rel(root, path)
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"at line (\d+)", str(exc))
        raise ConfigError([ConfigProblem(rel, int(m.group(1)) if m else None, f"TOML syntax error: {exc}")]) from None
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _problems_from(exc, path=rel, model=Recipe, line_of=lambda loc: _toml_line(text, loc), what="a recipe")
        ) from None


def load_recipes(root: Path) -> dict[str, Recipe]:
    rdir = root / RECIPES_DIR
    recipes: dict[str, Recipe] = {}
    problems: list[ConfigProblem] = []
    if not rdir.is_dir():
        raise ConfigError([ConfigProblem(RECIPES_DIR, None, "directory not found: add one NAME.toml per recipe")])
    for path in sorted(rdir.glob("*.toml")):
        name = path.stem
        if not re.match(r"^[a-z0-9][a-z0-9._-]*$", name):
            problems.append(
                ConfigProblem(_rel(root, path), None, f"recipe name {name!r} (the file stem) must match [a-z0-9][a-z0-9._-]*")
            )
            continue
        try:
            recipes[name] = load_recipe(root, path)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return recipes


def tmpfs_size(directory: str) -> int | None:
    """Size in bytes of the filesystem holding ``directory``; None when it does not exist."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def load_desired(root: str | os.PathLike[str], *, shm_size: int | None = None) -> DesiredState:
    """Load host, recipes and the host's manifest, and cross-check them. Raises ConfigError with every problem."""
    r = Path(root)
    problems: list[ConfigProblem] = []
    host: HostConfig | None = None
    recipes: dict[str, Recipe] = {}
    try:
        host = load_host(r)
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        recipes = load_recipes(r)
    except ConfigError as exc:
        problems.extend(exc.problems)

    mdir = r / MANIFESTS_DIR
    files = sorted([*mdir.glob("*.yaml"), *mdir.glob("*.yml")]) if mdir.is_dir() else []
    if not files:
        problems.append(
            ConfigProblem(
                MANIFESTS_DIR,
                None,
                "no manifest found: add manifests/<name>.yaml with 'host:' and 'assignments:' "
                "(an empty list means every GPU slot free)",
            )
        )
    manifests: list[tuple[str, Manifest, yaml.Node | None]] = []
    for path in files:
        try:
            m, node = _validate_yaml(r, path, Manifest, "a manifest")
            manifests.append((_rel(r, path), m, node))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if host is None or problems:
        raise ConfigError(problems)

    mine = [(p, m, n) for p, m, n in manifests if m.host == host.name]
    for p, m, n in manifests:
        if m.host != host.name:
            problems.append(
                ConfigProblem(
                    p,
                    _yaml_lines(n, ("host",)),
                    f"host: manifest is for host {m.host!r} but {HOST_FILE} names this host {host.name!r}. "
                    "Fix the name, or keep other hosts' manifests out of this root",
                )
            )
    if len(mine) > 1:
        problems.append(
            ConfigProblem(
                mine[1][0],
                _yaml_lines(mine[1][2], ("host",)),
                f"host: a second manifest for host {host.name!r} (the first is {mine[0][0]}); keep one document per host",
            )
        )
    if problems:
        raise ConfigError(problems)
    path, manifest, node = mine[0]
    assignments = _cross_check(path, manifest, node, host, recipes, problems, shm_size=shm_size)
    if problems:
        raise ConfigError(problems)
    return DesiredState(host=host, recipes=recipes, assignments=tuple(assignments), manifest_path=path)


def _cross_check(
    path: str,
    manifest: Manifest,
    node: yaml.Node | None,
    host: HostConfig,
    recipes: dict[str, Recipe],
    problems: list[ConfigProblem],
    *,
    shm_size: int | None,
) -> list[DesiredAssignment]:
    out: list[DesiredAssignment] = []
    given: dict[str, int] = {}
    for i, a in enumerate(manifest.assignments):
        line = _yaml_lines(node, ("assignments", i))
        recipe = recipes.get(a.recipe)
        if recipe is None:
            known = ", ".join(sorted(recipes)) or "none"
            problems.append(
                ConfigProblem(
                    path,
                    _yaml_lines(node, ("assignments", i, "recipe")),
                    f"assignments[{i}].recipe: unknown recipe {a.recipe!r}; known recipes: {known} "
                    f"(each is a file in {RECIPES_DIR}/NAME.toml)",
                )
            )
        for slot in a.gpus:
            if slot not in host.gpus:
                problems.append(
                    ConfigProblem(
                        path,
                        _yaml_lines(node, ("assignments", i, "gpus")),
                        f"assignments[{i}].gpus: unknown GPU slot {slot!r}; slots of host {host.name!r}: "
                        f"{', '.join(host.gpus)} (defined under gpus: in {HOST_FILE})",
                    )
                )
            elif slot in given and given[slot] != i:
                problems.append(
                    ConfigProblem(
                        path,
                        _yaml_lines(node, ("assignments", i, "gpus")),
                        f"assignments[{i}].gpus: GPU slot {slot!r} is already given to assignments[{given[slot]}]; "
                        "a slot runs one recipe at a time. Remove it from one of them",
                    )
                )
            else:
                given[slot] = i
        if len(set(a.gpus)) != len(a.gpus):
            problems.append(ConfigProblem(path, line, f"assignments[{i}].gpus: a slot is listed twice"))
        if recipe is not None and len(a.gpus) != recipe.tensor_parallel_size:
            problems.append(
                ConfigProblem(
                    path,
                    _yaml_lines(node, ("assignments", i, "gpus")),
                    f"assignments[{i}].gpus: recipe {a.recipe!r} has tensor_parallel_size = "
                    f"{recipe.tensor_parallel_size} and needs exactly that many GPU slots, got {len(a.gpus)}",
                )
            )
        if recipe is not None:
            out.append(
                DesiredAssignment(
                    recipe=a.recipe,
                    slots=tuple(a.gpus),
                    recipe_hash=recipe.content_hash(),
                    offload_bytes=recipe.offload.capacity_bytes,
                )
            )
    need = sum(a.offload_bytes for a in out)
    if need:
        size = shm_size if shm_size is not None else tmpfs_size(host.shm.dir)
        reserve = int(host.shm.reserve_gib * GIB)
        if size is None:
            problems.append(
                ConfigProblem(HOST_FILE, None, f"shm.dir: {host.shm.dir} does not exist; offload recipes need it")
            )
        elif need + reserve > size:
            problems.append(
                ConfigProblem(
                    path,
                    _yaml_lines(node, ("assignments",)),
                    f"assignments: offload capacities add up to {need / GIB:.2f} GiB, and with shm.reserve_gib "
                    f"{host.shm.reserve_gib} GiB to spare they do not fit the {size / GIB:.2f} GiB tmpfs at "
                    f"{host.shm.dir}. Pick smaller offload lanes or give the tmpfs more room",
                )
            )
    return out
