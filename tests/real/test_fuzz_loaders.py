"""Property-based fuzzing of the three loaders (host file, recipes, manifests) and of ``reconciler validate``.

The property: whatever the bytes, a root either loads, or the loader raises ConfigError whose every problem names
a file of the root (and ``validate`` exits 1 printing ``path[:line]: message`` lines) — never any other exception.
Inputs: arbitrary bytes; YAML and TOML documents built from nested mappings, lists and scalars of every type
(unicode, NUL, inf/nan, huge numbers), with keys given twice at any level; and the valid base root with one field
at a time replaced by such a value. The budget is fixed and the examples derandomised, so CI is deterministic.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.base.errors import ConfigError
from reconciler.cli import main
from reconciler.load.desired import load_desired
from reconciler.load.host_file import load_host
from reconciler.load.recipes import load_recipes

BASE = Path(__file__).resolve().parents[1] / "cases" / "bad" / "_base"
HOST, OMNI, LANE, MANIFEST = (
    "configs/host.yaml",
    "configs/recipes/omni.toml",
    "configs/recipes/lane.toml",
    "manifests/base.yaml",
)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def base(shared_tmpfs: Path) -> Iterator[Path]:
    """The corpus's valid base root with its tmpfs filled in, copied once; each example copies it again."""
    d = Path(tempfile.mkdtemp(prefix="reconciler-fuzz-base-"))
    shutil.copytree(BASE, d / "root")
    for f in (d / "root").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes().replace(b"@SHM@", str(shared_tmpfs).encode()))
    yield d / "root"
    shutil.rmtree(d)


@contextlib.contextmanager
def root_with(base: Path, files: dict[str, bytes]) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="reconciler-fuzz-") as d:
        root = Path(d) / "root"
        shutil.copytree(base, root)
        for rel, data in files.items():
            (root / rel).write_bytes(data)
        yield root


def holds(root: Path) -> None:
    """The property, for the loaders and for ``validate``."""
    for load in (load_desired, load_host, lambda r: load_recipes(Path(r))):
        try:
            load(root)
        except ConfigError as exc:
            assert exc.problems
            for p in exc.problems:
                assert p.path.startswith(("configs/", "manifests")), f"a problem that names no file: {p}"
                assert p.message and (p.line is None or p.line >= 1), p
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["--root", str(root), "validate"])
    assert code in (0, 1)
    lines = err.getvalue().splitlines()
    assert (code == 0) == (not lines), err.getvalue()
    for ln in lines:
        assert ln.startswith(("configs/", "manifests")), f"validate printed a line that names no file: {ln!r}"
        assert "Traceback" not in ln


# ---------------------------------------------------------------- strategies

KEYS = st.sampled_from(
    [
        "name",
        "gpus",
        "dir",
        "pattern",
        "host",
        "assignments",
        "recipe",
        "index",
        "uuid",
        "image",
        "command",
        "volumes",
        "env",
        "ipc",
        "network",
        "url",
        "shm",
        "docker",
        "offload",
        "capacity_gib",
        "enabled",
        "",
        "<<",
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(
        ["/", "*", ".*", "..", "/dev/shm", "vllm_offload_*.mmap", "\x00", "container:", "host", "127.0.0.1"]
    )
)


class Pairs(list):  # type: ignore[type-arg]
    """A mapping written as (key, value) pairs, so that a key may come twice."""


def pairs_of(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Pairs]:
    base = st.lists(st.tuples(KEYS, children), max_size=5)
    # Duplicate one key on purpose half of the time.
    return st.tuples(base, st.booleans()).map(
        lambda t: Pairs(t[0] + ([(t[0][0][0], t[0][-1][1])] if t[1] and t[0] else []))
    )


TREES = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4) | pairs_of(children), max_leaves=12)


def yaml_scalar(v: Any) -> str:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return ".nan" if math.isnan(v) else (".inf" if v > 0 else "-.inf")
    return json.dumps(v)  # JSON scalars are YAML flow scalars


def to_yaml(v: Any) -> str:
    """Flow-style YAML, keys kept as given (duplicates included)."""
    if isinstance(v, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {to_yaml(x)}" for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(to_yaml(x) for x in v) + "]"
    return yaml_scalar(v)


def toml_key(k: str) -> str:
    return json.dumps(k)


def toml_value(v: Any) -> str:
    if isinstance(v, Pairs):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    return json.dumps(v)


def to_toml(doc: Pairs) -> str:
    """Top-level pairs, a Pairs value as a [table] (tables last), so duplicate keys and tables both occur."""
    plain = [(k, v) for k, v in doc if not isinstance(v, Pairs)]
    tables = [(k, v) for k, v in doc if isinstance(v, Pairs)]
    out = [f"{toml_key(k)} = {toml_value(v)}" for k, v in plain]
    for k, table in tables:
        out.append(f"[{toml_key(k)}]")
        out += [f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in table]
    return "\n".join(out) + "\n"


DOCS = pairs_of(TREES)


def set_path(doc: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    if isinstance(doc, dict):
        out = dict(doc)
        out[head] = set_path(doc.get(head), rest, value) if head in doc else value
        return out
    if isinstance(doc, list) and isinstance(head, int) and head < len(doc):
        out_l = list(doc)
        out_l[head] = set_path(doc[head], rest, value)
        return out_l
    return value


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[list[Any]]:
    out = [list(prefix)] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def plain(v: Any) -> Any:
    if isinstance(v, Pairs):
        return {str(k): plain(x) for k, x in v}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


# ---------------------------------------------------------------- the properties

FILES = st.sampled_from([HOST, OMNI, LANE, MANIFEST])


@FUZZ
@given(which=FILES, data=st.binary(max_size=300))
def test_arbitrary_bytes(base: Path, which: str, data: bytes) -> None:
    with root_with(base, {which: data}) as root:
        holds(root)


@FUZZ
@given(which=FILES, data=st.binary(max_size=60), at=st.integers(min_value=0, max_value=400))
def test_bytes_spliced_into_a_valid_file(base: Path, which: str, data: bytes, at: int) -> None:
    text = (base / which).read_bytes()
    at = min(at, len(text))
    with root_with(base, {which: text[:at] + data + text[at:]}) as root:
        holds(root)


@FUZZ
@given(which=st.sampled_from([HOST, MANIFEST]), doc=DOCS)
def test_yaml_documents(base: Path, which: str, doc: Pairs) -> None:
    with root_with(base, {which: to_yaml(doc).encode()}) as root:
        holds(root)


@FUZZ
@given(which=st.sampled_from([OMNI, LANE]), doc=DOCS)
def test_toml_documents(base: Path, which: str, doc: Pairs) -> None:
    with root_with(base, {which: to_toml(doc).encode()}) as root:
        holds(root)


@FUZZ
@given(which=st.sampled_from([HOST, MANIFEST]), choice=st.integers(min_value=0), value=TREES)
def test_one_yaml_field_replaced(base: Path, which: str, choice: int, value: Any) -> None:
    doc = yaml.safe_load((base / which).read_text())
    where = paths(doc)
    path = where[choice % len(where)]
    mutated = set_path(doc, path, plain(value))
    text = yaml.safe_dump(mutated, allow_unicode=True, sort_keys=False)
    with root_with(base, {which: text.encode()}) as root:
        holds(root)


@FUZZ
@given(which=st.sampled_from([OMNI, LANE]), choice=st.integers(min_value=0), value=TREES)
def test_one_toml_field_replaced(base: Path, which: str, choice: int, value: Any) -> None:
    import tomllib

    doc = tomllib.loads((base / which).read_text())
    where = paths(doc)
    path = where[choice % len(where)]
    mutated = set_path(doc, path, value)

    def as_pairs(v: Any) -> Any:
        if isinstance(v, dict):
            return Pairs((k, as_pairs(x)) for k, x in v.items())
        if isinstance(v, list):
            return [as_pairs(x) for x in v]
        return v

    with root_with(base, {which: to_toml(as_pairs(mutated)).encode()}) as root:
        holds(root)
