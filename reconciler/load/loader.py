"""Loading the operator's files into the model, with errors that name the file, the line, the field and the fix.

Called by every command: ``load_host(root)`` for the shm commands, ``load_desired(root)`` for the rest.
All problems found are collected and raised together as one ``ConfigError``; nothing is acted on unless the
whole desired state is valid.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import stat
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ValidationError

from reconciler.base import fsafe, mounts
from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.base.mounts import MOUNTINFO, TMPFS_MAGIC
from reconciler.base.units import human_bytes
from reconciler.model import (
    DesiredAssignment,
    DesiredState,
    HostConfig,
    Manifest,
    Recipe,
    check_name,
    offload_lands_in,
)

HOST_FILE = "configs/host.yaml"
RECIPES_DIR = "configs/recipes"
MANIFESTS_DIR = "manifests"


# ---------------------------------------------------------------- locating fields in source text


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _merged_pairs(node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
    """``node``'s own key/value pairs, then those its merge keys bring (``<<: *base``, ``<<: [*a, *b]``, depth
    first, an earlier source before a later one), read without changing the node. The first pair of a key is the
    one that counts: own keys override merged ones, as YAML's merge key says."""
    own = [(k, v) for k, v in node.value if k.tag != _MERGE_TAG]
    merged: list[tuple[yaml.Node, yaml.Node]] = []
    for k, v in node.value:
        if k.tag == _MERGE_TAG:
            for source in v.value if isinstance(v, yaml.SequenceNode) else [v]:
                if isinstance(source, yaml.MappingNode):
                    merged.extend(_merged_pairs(source))
    return own + merged


def _yaml_lines(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """The 1-based line of the deepest YAML node found along ``loc`` (a pydantic error location); a key that came
    through a merge key points where it was written."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in _merged_pairs(node):
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


def _toml_line(text: str, loc: Sequence[Any]) -> int | None:
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


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


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
            msg = f"{field}: unknown key {_short(loc[-1])} in {what}{hint}. Remove it or fix its spelling"
        elif kind == "missing":
            msg = f"{field}: required key is missing in {what}. Add it"
        else:
            text = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None or repr(got) in text else f" (got {_short(got)})"
            bare = _unquoted(kind, got)
            if bare is not None:
                sep = " = " if what == "a recipe" else ": "
                shown += f"; a number or boolean is written without quotes: {loc[-1]}{sep}{bare}"
            if "env" in loc:
                shown = ""  # an env value may be a secret: the message names the key, never the value
            msg = f"{text}{shown}" if text.startswith(field) else f"{field}: {text}{shown}"
        problems.append(ConfigProblem(path, line_of(loc), msg))
    return problems


# ---------------------------------------------------------------- files

MAX_FILE_BYTES = 1 << 20  # an operator's file is a few KiB; anything near this is not one
MAX_YAML_NODES = 20000  # with aliases expanded: a few aliases must not make validation run for hours


def _rel(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def _read_text(root: Path, path: Path, what: str) -> str:
    """The file's text: a regular file of UTF-8 text, at most MAX_FILE_BYTES; else a ConfigError naming it.

    Opened without blocking and checked with fstat before reading, so a FIFO, a device (a symlink to /dev/zero)
    or a directory is refused instead of hanging or filling memory."""
    rel = _rel(root, path)
    try:
        fsafe.check_trusted(path, what=what, last=None)  # the way to it; the file itself on the open descriptor
    except fsafe.UnsafePath as exc:
        raise ConfigError([ConfigProblem(rel, None, str(exc))]) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(rel, None, "file not found")]) from None
    except OSError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"cannot read {what}: {exc.strerror or exc}")]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigError([ConfigProblem(rel, None, f"{what} is {kind}; it must be a regular file of text")])
        fsafe.check_owner(st, path, what=what)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except fsafe.UnsafePath as exc:
        raise ConfigError([ConfigProblem(rel, None, str(exc))]) from None
    except OSError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"cannot read {what}: {exc.strerror or exc}")]) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(
            [ConfigProblem(rel, None, f"{what} is larger than {human_bytes(MAX_FILE_BYTES)}; is this the right file?")]
        )
    nul = data.find(b"\x00")
    if nul >= 0:
        line, col = _line_col(data, nul)
        raise ConfigError(
            [
                ConfigProblem(
                    rel,
                    line,
                    f"a NUL byte at column {col}: this is a binary file, not {what} in UTF-8 text. "
                    "Restore the text (was it saved as UTF-16, or overwritten?)",
                )
            ]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        raise ConfigError(
            [
                ConfigProblem(
                    rel,
                    line,
                    f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {col} ({exc.reason}). Save it as UTF-8 "
                    "(was it written in Latin-1 or a Windows code page?)",
                )
            ]
        ) from None
    return text.removeprefix("\ufeff")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is recorded (PyYAML keeps the last silently),
    and merge keys are expanded without rewriting the document.

    PyYAML's own merge (``flatten_mapping``) rewrites each merged mapping's node in place: a mapping that uses
    ``<<`` and is then reached again through an alias (merged into another, before its own turn came) was seen
    with the merged keys as its own, refused as a "duplicate key", and merged into the other without its own
    overrides (``b: 2`` over a base's ``b: 0`` arrived as 0)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[tuple[Any, int, int]] = []  # (key, first line, second line)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                # '<<: *base' merges; keys written next to it override on purpose. Only mappings merge.
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if not isinstance(source, yaml.MappingNode):
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping",
                            node.start_mark,
                            f"expected a mapping or list of mappings for merging, but found {source.id}",
                            source.start_mark,
                        )
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable: reported below
            if first is not None:
                self.duplicates.append((key, first.start_mark.line + 1, key_node.start_mark.line + 1))
            else:
                seen[key] = key_node
        mapping: dict[Any, Any] = {}
        for key_node, value_node in _merged_pairs(node):
            if key_node.tag == "tag:yaml.org,2002:value":
                key_node.tag = "tag:yaml.org,2002:str"  # a bare '=' key is the string '=', as PyYAML reads it
            key = self.construct_object(key_node, deep=deep)
            try:
                taken = key in mapping
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                ) from None
            if not taken:
                mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


# YAML 1.2 reads 1e30 and 5E-3 as numbers; PyYAML's YAML 1.1 resolver wants a dot in them and gave a string,
# which the file models' strict types would refuse as "not a number" for what the operator wrote as one.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _expanded_size(node: yaml.Node | None) -> int:
    """Nodes in the document with every alias expanded, counted up to just past MAX_YAML_NODES."""
    count = 0
    stack = [node] if node is not None else []
    while stack and count <= MAX_YAML_NODES:
        n = stack.pop()
        count += 1
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))
    return count


def _read_yaml(root: Path, path: Path, what: str = "a YAML file") -> tuple[Any, yaml.Node | None]:
    rel = _rel(root, path)
    text = _read_text(root, path, what)
    parsed = _PARSED.get(text)
    if parsed is not None:
        return parsed
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if _expanded_size(node) > MAX_YAML_NODES:
            raise ConfigError(
                [
                    ConfigProblem(
                        rel,
                        None,
                        f"the document is too large with its aliases (*name) expanded (over {MAX_YAML_NODES} values); "
                        "write the values out instead of nesting aliases",
                    )
                ]
            )
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        msg = f"YAML syntax error: {exc.problem or exc}"
        if exc.context:
            ctx = exc.context_mark
            msg += f" ({exc.context}" + (f" started at line {ctx.line + 1})" if ctx else ")")
        if isinstance(exc, yaml.constructor.ConstructorError) and "tag" in (exc.problem or ""):
            msg += "; YAML tags (!!python/..., !name) are not read here: write a plain value"
        elif "'\\t'" in (exc.problem or ""):
            msg += "; YAML indents with spaces, not tabs"
        raise ConfigError([ConfigProblem(rel, line, msg)]) from None
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text.encode("utf-8", "replace"), exc.position) if exc.position is not None else (None, 0)
        raise ConfigError(
            [ConfigProblem(rel, line, f"YAML cannot hold the character {exc.character!r} (column {col}); remove it")]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"YAML error: {exc}")]) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, "YAML nested too deeply to read; flatten it")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader.duplicates:
        raise ConfigError(
            [
                ConfigProblem(
                    rel,
                    second,
                    f"duplicate key {_short(key)}: given at line {first} and again at line {second}; "
                    "YAML would silently keep only the last one. Remove one of them",
                )
                for key, first, second in loader.duplicates
            ]
        )
    _remember(_PARSED, text, (data, node))
    return data, node


# The loop loads every file at every pass, and a file rarely changes between two: the parse of a YAML text (the
# pure-Python composer, about 7 ms for the host file) and the validated recipe of a TOML text (tomllib, about 2 ms)
# are kept for the text they came from. Only texts that parsed are kept, so an error is reported afresh every time;
# nothing kept is ever mutated (the models are frozen and built from the parsed values).
_V = TypeVar("_V")
_PARSED: dict[str, tuple[Any, yaml.Node | None]] = {}
_RECIPES: dict[str, Recipe] = {}
_KEEP = 64


def _remember(cache: dict[str, _V], text: str, value: _V) -> None:
    if len(cache) >= _KEEP:
        cache.pop(next(iter(cache)))
    cache[text] = value


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validate_yaml(root: Path, path: Path, model: type[BaseModel], what: str) -> tuple[Any, yaml.Node | None]:
    data, node = _read_yaml(root, path, what)
    rel = _rel(root, path)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError([ConfigProblem(rel, 1, f"expected a mapping (key: value lines) for {what}, got {got}")])
    try:
        return model.model_validate(data), node
    except ValidationError as exc:
        raise ConfigError(
            _problems_from(exc, path=rel, model=model, line_of=lambda loc: _yaml_lines(node, loc), what=what)
        ) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, f"{what} is nested too deeply; flatten it")]) from None


# ---------------------------------------------------------------- shm.dir: an existing tmpfs mount point


def shm_dir_mount_problem(directory: str, *, mountinfo: str | None = None) -> str | None:
    """None when ``directory`` is an existing tmpfs mount point; else what is wrong, which source said so, and the fix.

    Reads /proc/self/mountinfo (or ``mountinfo``, for tests); where that cannot be read, statfs(2)'s f_type and
    os.path.ismount. The shm guard may call this again before it deletes anything."""
    fix = f"mount one there (mount -t tmpfs -o size=32g tmpfs {directory}) or point shm.dir at one, like /dev/shm"
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return f"shm.dir {directory} does not exist; {fix}"
    except OSError as exc:
        return f"shm.dir {directory} cannot be examined ({exc.strerror or exc}); {fix}"
    real = os.path.realpath(directory)
    if stat.S_ISLNK(st.st_mode) or real != directory:
        return (
            f"shm.dir {directory} is reached through a symlink (its real path is {real}); offload files are checked "
            f"to lie inside shm.dir by their real path, so write dir: {real}"
        )
    if not stat.S_ISDIR(st.st_mode):
        return f"shm.dir {directory} is not a directory; {fix}"
    if mountinfo is None:
        try:
            mountinfo = mounts.read_mountinfo()
        except OSError:
            mountinfo = None
    if mountinfo is not None:
        held = mounts.mount_holding(real, mounts.parse_mountinfo(mountinfo))
        mnt, fstype = held.point, held.fstype
        if fstype != "tmpfs":
            return f"shm.dir {directory} is not a tmpfs: {MOUNTINFO} shows it on {fstype} mounted at {mnt}; {fix}"
        if mnt != real:
            return (
                f"shm.dir {directory} is inside the tmpfs mounted at {mnt} ({MOUNTINFO}) but is not its mount point; "
                f"the tmpfs's size and free room are those of {mnt}: write dir: {mnt}, or {fix}"
            )
        return None
    ftype = mounts.fs_magic(real)
    if ftype is None:
        return f"shm.dir {directory}: cannot tell whether it is a tmpfs ({MOUNTINFO} and statfs both unavailable)"
    if ftype != TMPFS_MAGIC:
        return f"shm.dir {directory} is not a tmpfs: statfs gives f_type 0x{ftype:08x}, not TMPFS_MAGIC 0x{TMPFS_MAGIC:08x}; {fix}"
    if not os.path.ismount(real):
        return f"shm.dir {directory} is on a tmpfs (statfs) but is not its mount point; {fix}"
    return None


def tmpfs_size(directory: str) -> int | None:
    """Size in bytes of the filesystem holding ``directory``; None when it does not exist."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def tmpfs_free(directory: str) -> int | None:
    """Bytes free now on the filesystem holding ``directory``; None when it does not exist."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_frsize * st.f_bavail


# ---------------------------------------------------------------- the root itself


def check_root(r: Path) -> None:
    """The root and its directories checked like the tool's own files (docs/design.md, safety rule 12) before
    anything is read from them: owned by root (or the running user) and not writable by group or others, along
    their whole real path. A ConfigError naming the first that is not, and the fix. A root that is no directory at
    all is said so first, alone: its missing files would only repeat it."""
    if not r.is_dir():
        why = "no such directory" if not r.exists() else "not a directory"
        raise ConfigError(
            [
                ConfigProblem(
                    str(r),
                    None,
                    f"{why}: give --root (or $RECONCILER_ROOT) the directory holding configs/ and manifests/",
                )
            ]
        )
    for rel, what in (
        (".", "--root"),
        ("configs", "the configs directory"),
        (RECIPES_DIR, "the recipes directory"),
        (MANIFESTS_DIR, "the manifests directory"),
    ):
        path = r if rel == "." else r / rel
        try:
            fsafe.check_trusted(path, what=what)
        except fsafe.UnsafePath as exc:
            raise ConfigError([ConfigProblem(str(r) if rel == "." else rel, None, str(exc))]) from None


# ---------------------------------------------------------------- the three kinds of file


def _load_host(r: Path) -> tuple[HostConfig, yaml.Node | None]:
    path = r / HOST_FILE
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            [ConfigProblem(_rel(r, path), None, f"file not found: is --root {r} the directory holding configs/?")]
        )
    host, node = _validate_yaml(r, path, HostConfig, "the host file")
    problem = shm_dir_mount_problem(host.shm.dir)
    if problem:
        raise ConfigError([ConfigProblem(HOST_FILE, _yaml_lines(node, ("shm", "dir")), problem)])
    return host, node


def load_host(root: str | os.PathLike[str]) -> HostConfig:
    """The host file, validated, with shm.dir checked to be an existing tmpfs mount point."""
    check_root(Path(root))
    return _load_host(Path(root))[0]


def _toml_problem(rel: str, text: str, exc: tomllib.TOMLDecodeError) -> ConfigProblem:
    msg = str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg) or re.search(r"\s*\(at line (\d+)\)$", msg)
    line = int(m.group(1)) if m else None
    if m is None:
        m2 = re.search(r"\(at end of document\)$", msg)
        line = len(text.splitlines()) or 1 if m2 else None
    detail = msg[: m.start()] if m else msg
    if m and m.lastindex == 2:
        detail += f" (column {m.group(2)})"
    if line and any(w in msg for w in ("Cannot overwrite", "Cannot declare", "Cannot mutate", "Duplicate")):
        first = _toml_first_line_of(text, line)
        where = f"; it was first given at line {first}" if first else ""
        return ConfigProblem(
            rel, line, f"duplicate key: {detail}{where}. A key may be given once per table: remove one of them"
        )
    return ConfigProblem(rel, line, f"TOML syntax error: {detail}")


def load_recipe(root: Path, path: Path) -> Recipe:
    rel = _rel(root, path)
    text = _read_text(root, path, "a recipe")
    known = _RECIPES.get(text)
    if known is not None:
        return known
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([_toml_problem(rel, text, exc)]) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, "TOML nested too deeply to read; flatten it")]) from None
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _problems_from(exc, path=rel, model=Recipe, line_of=lambda loc: _toml_line(text, loc), what="a recipe")
        ) from None
    except RecursionError:
        raise ConfigError([ConfigProblem(rel, None, "the recipe is nested too deeply; flatten it")]) from None
    problem = _command_tp_problem(recipe)
    if problem:
        raise ConfigError([ConfigProblem(rel, _toml_line(text, ("container", "command")), problem)])
    _remember(_RECIPES, text, recipe)
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


def _host_ports(recipe: Recipe) -> list[tuple[int, str]]:
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
    return _load_recipes(root)


def _load_recipes(root: Path) -> dict[str, Recipe]:
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
                    _rel(root, path),
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


def load_desired(
    root: str | os.PathLike[str], *, shm_size: int | None = None, shm_free: int | None = None
) -> DesiredState:
    """Load host, recipes and the host's manifest, and cross-check them. Raises ConfigError with every problem.

    ``shm_size`` and ``shm_free`` stand in for the tmpfs's real figures (tests)."""
    r = Path(root)
    check_root(r)
    problems: list[ConfigProblem] = []
    host: HostConfig | None = None
    host_node: yaml.Node | None = None
    recipes: dict[str, Recipe] = {}
    try:
        host, host_node = _load_host(r)
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        recipes = _load_recipes(r)
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
    if host is not None:
        for name, recipe in sorted(recipes.items()):
            if recipe.offload.enabled and not offload_lands_in(recipe.container, host.shm.dir):
                problems.append(
                    ConfigProblem(
                        recipe_file(name),
                        _toml_line_of_file(r, name, ("container", "volumes")),
                        f"recipe {name!r} has offload enabled, but its offload files would not land in shm.dir "
                        f"{host.shm.dir} ({HOST_FILE}), where they are counted and guarded: "
                        + (
                            'set ipc = "host" (the container then shares the host\'s /dev/shm)'
                            if host.shm.dir == "/dev/shm"
                            else f'add "{host.shm.dir}:{host.shm.dir}" to container.volumes and point the server\'s '
                            "offload directory at it"
                        ),
                    )
                )
    if host is None or problems:
        raise ConfigError(problems)

    mine = [(p, m, n) for p, m, n in manifests if m.host == host.name]
    for p, m, n in manifests:
        if m.host != host.name:
            problems.append(
                ConfigProblem(
                    p,
                    _yaml_lines(n, ("host",)),
                    f"host: manifest is for host {_short(m.host)} but {HOST_FILE} names this host {host.name!r}. "
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
    manifest_path, manifest, node = mine[0]
    assignments = _cross_check(
        manifest_path,
        manifest,
        node,
        host,
        recipes,
        problems,
        shm_size=shm_size,
        shm_free=shm_free,
        host_node=host_node,
    )
    secret_digests = _secret_digests(r, host, recipes, problems)
    if problems:
        raise ConfigError(problems)
    return DesiredState(
        host=host,
        recipes=recipes,
        assignments=tuple(assignments),
        manifest_path=manifest_path,
        secret_digests=secret_digests,
        fallback=manifest.fallback,
    )


def _secret_digests(
    root: Path, host: HostConfig, recipes: dict[str, Recipe], problems: list[ConfigProblem]
) -> dict[str, str]:
    """The digest of every ``"${NAME}"`` env value the recipes take; a problem (never the value) for each that
    cannot be resolved, at the recipe line that asks for it."""
    from reconciler.load.secrets import SecretError, read_env_file, resolve

    wanted: dict[str, list[tuple[str, str]]] = {}
    for name, recipe in recipes.items():
        for key, var in recipe.container.env_refs().items():
            wanted.setdefault(var, []).append((name, key))
    if not wanted:
        return {}
    env_file = host.secrets.env_file
    if env_file:
        try:
            read_env_file(env_file)
        except SecretError as exc:
            problems.append(ConfigProblem(HOST_FILE, None, f"{exc}"))
            return {}
    from reconciler.load.secrets import digest

    out: dict[str, str] = {}
    for var, users in wanted.items():
        try:
            out[var] = digest(resolve(env_file, [var])[var])
        except SecretError as exc:
            for recipe_name, key in users:
                path = root / RECIPES_DIR / f"{recipe_name}.toml"
                try:
                    line = _toml_line(path.read_text(encoding="utf-8"), ("container", "env", key))
                except (OSError, UnicodeDecodeError):
                    line = None
                problems.append(
                    ConfigProblem(
                        _rel(root, path),
                        line,
                        f"container.env.{key}: ${{{var}}} is {exc}. Set it there (the value is never printed)",
                    )
                )
    return out


def _toml_line_of_file(root: Path, name: str, loc: Sequence[Any]) -> int | None:
    try:
        return _toml_line((root / RECIPES_DIR / f"{name}.toml").read_text(encoding="utf-8"), loc)
    except (OSError, UnicodeDecodeError):
        return None


def _port_clashes(
    path: str, manifest: Manifest, node: yaml.Node | None, recipes: dict[str, Recipe], problems: list[ConfigProblem]
) -> None:
    """Two lanes of one manifest on the host's network that listen on (or are asked at) one port: the second
    cannot bind it, or its health check and probes would be answered by the first."""
    taken: dict[int, tuple[int, str, str]] = {}  # port -> (assignment, recipe, where its recipe says it)
    for i, a in enumerate(manifest.assignments):
        recipe = recipes.get(a.recipe)
        if recipe is None:
            continue
        mine: dict[int, str] = {}
        for port, where in _host_ports(recipe):
            mine.setdefault(port, where)
        for port, where in mine.items():
            if port not in taken:
                taken[port] = (i, a.recipe, where)
                continue
            j, other, other_where = taken[port]
            fix = (
                "Give one recipe another port (its --port, health.url and probes), or a network other than host"
                if other != a.recipe
                else "A recipe on the host's network runs once at a time: give the second assignment a copy of the "
                "recipe with a port of its own (--port, health.url and probes), or the recipe a network other than host"
            )
            problems.append(
                ConfigProblem(
                    path,
                    _yaml_lines(node, ("assignments", i, "recipe")),
                    f"assignments[{i}].recipe: recipe {a.recipe!r} and assignments[{j}]'s recipe {other!r} both "
                    f"listen on port {port} of the host's network ({where} in {recipe_file(a.recipe)}; {other_where} "
                    f"in {recipe_file(other)}): one of them could not bind it, or would have its health checked and "
                    f"its probes answered by the other. {fix}",
                )
            )
            break


def _cross_check(
    path: str,
    manifest: Manifest,
    node: yaml.Node | None,
    host: HostConfig,
    recipes: dict[str, Recipe],
    problems: list[ConfigProblem],
    *,
    shm_size: int | None,
    shm_free: int | None = None,
    host_node: yaml.Node | None = None,
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
                    f"assignments[{i}].recipe: unknown recipe {_short(a.recipe)}; known recipes: {known} "
                    f"(each is a file in {RECIPES_DIR}/NAME.toml)",
                )
            )
        for slot in a.gpus:
            if slot not in host.gpus:
                problems.append(
                    ConfigProblem(
                        path,
                        _yaml_lines(node, ("assignments", i, "gpus")),
                        f"assignments[{i}].gpus: unknown GPU slot {_short(slot)}; slots of host {host.name!r}: "
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
                    f"assignments[{i}].gpus: recipe {a.recipe!r} ({recipe_file(a.recipe)}) has tensor_parallel_size = "
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
    _port_clashes(path, manifest, node, recipes, problems)
    need = sum(a.offload_bytes for a in out)
    if need:
        size = shm_size if shm_size is not None else tmpfs_size(host.shm.dir)
        free = shm_free if shm_free is not None else (None if shm_size is not None else tmpfs_free(host.shm.dir))
        reserve = host.shm.reserve_bytes
        if size is None:
            problems.append(
                ConfigProblem(
                    HOST_FILE,
                    _yaml_lines(host_node, ("shm", "dir")),
                    f"shm.dir: {host.shm.dir} does not exist; offload recipes need it",
                )
            )
        elif need + reserve > size:
            lanes = [a for a in out if a.offload_bytes]
            each = ", ".join(f"{a.recipe} ({human_bytes(a.offload_bytes)})" for a in lanes)
            free_now = f", {human_bytes(free)} of it free now" if free is not None else ""
            problems.append(
                ConfigProblem(
                    path,
                    _yaml_lines(node, ("assignments",)),
                    f"assignments: the offload lanes need more room than the tmpfs at {host.shm.dir} has: "
                    f"their capacities ({each}) add up to {human_bytes(need)}, and with shm.reserve_gib "
                    f"({human_bytes(reserve)}, kept free in {HOST_FILE}) that is {human_bytes(need + reserve)}, "
                    f"but the tmpfs is {human_bytes(size)}{free_now}. Assign fewer or smaller offload lanes "
                    f"(offload.capacity_gib in {', '.join(recipe_file(a.recipe) for a in lanes)}), lower "
                    "shm.reserve_gib, or give the tmpfs more room",
                )
            )
    return out
