"""The published JSON Schemas of the operator's files (schemas/, ``reconciler schema KIND``).

- schemas/*.schema.json are what the model generates (regenerate with ``make schemas``), and pass the draft 2020-12
  meta-schema;
- every shipped host file, recipe and manifest validates, and points its editor at its schema;
- every case of the bad-input corpus (tests/cases/bad) is refused by the schema, unless its files cannot even be
  parsed or it is in LOADER_ONLY below: what no schema can say (cross-references, the tmpfs, duplicate keys, ...)
  stays the loader's job, and the list is checked both ways;
- an editor-style checker (check-jsonschema, run as a process) passes the shipped files and fails a broken one.

Patterns are ECMA-262 regular expressions, as JSON Schema says and as editors and check-jsonschema run them; the
validator here runs them the same way (regress), since Python's re lets '$' match before a final newline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import regress
import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from reconciler.cli import main
from reconciler.load.file_schema import KINDS, render, schema

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas"
CASES = REPO / "tests" / "cases" / "bad"
SHM = "/run/reconciler-schema-test/shm"  # stands in for @SHM@: the schema checks text, not mounts

# The corpus cases whose files parse and pass the schema, and why only the loader refuses them.
LOADER_ONLY = {
    "001-host-duplicate-top-level-key": "duplicate keys: a YAML parser keeps the last one silently",
    "002-host-duplicate-shm-dir": "duplicate keys",
    "003-host-duplicate-gpu-slot": "duplicate keys",
    "004-host-duplicate-key-in-flow-mapping": "duplicate keys",
    "006-host-duplicate-docker-section": "duplicate keys",
    "008-manifest-assignments-twice-second-list": "duplicate keys",
    "009-manifest-duplicate-host": "duplicate keys",
    "010-manifest-duplicate-key-in-assignment": "duplicate keys",
    "011-manifest-duplicate-key-in-flow-assignment": "duplicate keys",
    "061-shm-dir-not-tmpfs": "whether shm.dir is a tmpfs mount point is a fact of the host",
    "062-shm-dir-proc": "whether shm.dir is a tmpfs mount point is a fact of the host",
    "063-shm-dir-missing": "whether shm.dir exists is a fact of the host",
    "064-shm-dir-a-file": "whether shm.dir is a directory is a fact of the host",
    "084-shm-reserve-nan": "NaN is no JSON number; YAML's .nan passes every bound",
    "102-gpu-slot-same-gpu": "two slots naming one card: a comparison across entries",
    "108-recipe-name-uppercase": "a recipe's name is its file name",
    "109-recipe-name-space": "a recipe's name is its file name",
    "110-recipe-name-hidden": "a recipe's name is its file name (and a hidden file is not even read)",
    "139-volume-same-target-twice": "two volumes mounting at one place: a comparison across entries",
    "166-offload-capacity-nan": "NaN is no JSON number; TOML's nan passes every bound",
    "178-recipe-offload-outside-shm-dir": "a recipe read against the host file",
    "179-manifest-unknown-recipe": "a manifest read against the recipes",
    "180-manifest-unknown-slot": "a manifest read against the host file",
    "182-manifest-slot-in-two-assignments": "a comparison across assignments",
    "183-manifest-tp-mismatch": "a manifest read against the recipes",
    "184-manifest-offload-over-tmpfs": "a manifest read against the recipes and the tmpfs's size",
    "185-manifest-other-host": "a manifest read against the host file",
    "186-manifest-second-for-host": "two manifests compared",
    "187-manifest-none": "no manifest at all: a schema checks the files there are",
    "251-recipe-probe-chat-without-prompt": "what each probe kind needs",
    "252-recipe-probe-schema-misspelt-keyword": "a probe's own JSON Schema, read against the keywords it may hold",
    "252-recipe-probe-schema-unsupported-keyword": "a probe's own JSON Schema, read against the keywords it may hold",
    "255-recipe-probe-duplicate-name": "a comparison across probes",
    "256-recipe-probe-models-with-prompt": "what each probe kind reads",
    "260-recipe-probe-schema-bad-type": "a probe's own JSON Schema, read against the meta-schema",
    "290-gpu-uuid-in-two-letter-cases": "two slots naming one card: a comparison across entries",
    "291-gpu-index-and-uuid-without-telemetry": "a slot read against gpu_telemetry",
    "292-recipe-probe-tool-result-contains-not-in-result": "one probe setting read against another",
    "293-recipe-probe-tools-function-not-offered": "one probe setting read against another",
    "342-manifest-two-recipes-serve-one-name": "a manifest read against the names its recipes serve",
    "343-manifest-alias-unknown-recipe": "a manifest read against the recipes",
    "344-manifest-alias-hides-served-name": "a manifest read against the names its recipes serve",
    "345-recipe-served-names-not-the-command": "one recipe setting read against its command",
    "346-manifest-demand-unknown-topology": "a comparison across the manifest's keys",
    "294-recipe-probe-tool-parameters-not-a-schema": "a tool's parameters, read against the meta-schema",
    "295-recipe-probe-needle-with-contains": "what each probe kind reads",
    "338-recipe-probe-schema-unresolvable-ref": "a probe's own JSON Schema, its references resolved within it",
    "339-recipe-health-url-on-another-port": "a port inside the command's words against the health URL's",
    "340-recipe-server-bound-elsewhere": "the address inside the command's words against the health URL's host",
    "341-recipe-probe-asks-a-name-not-served": "the command's served names against each probe's model",
    "253-recipe-probe-bad-regex": "a regular expression that does not compile is the loader's to find",
    "332-recipe-command-tp-mismatch": "the server's flags read against tensor_parallel_size",
    "333-recipe-command-tp-short-flag-mismatch": "the server's flags read against tensor_parallel_size",
    "334-recipe-command-tp-equals-mismatch": "the server's flags read against tensor_parallel_size",
    "335-manifest-two-host-network-lanes-one-health-port": "a comparison across assignments and their recipes",
    "336-manifest-two-host-network-lanes-one-command-port": "a comparison across assignments and their recipes",
    "337-manifest-one-host-network-recipe-twice": "a comparison across assignments and their recipes",
}


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and regress.Regex(pattern).find(instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# Draft 2020-12 with ECMA-262 patterns (the keyword's dialect), as editors and check-jsonschema apply them.
Validator = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})


def kind_of(rel: str) -> str | None:
    if rel == "configs/host.yaml":
        return "host"
    if rel.startswith("configs/recipes/") and rel.endswith(".toml"):
        return "recipe"
    if rel.startswith("manifests/") and rel.endswith((".yaml", ".yml")):
        return "manifest"
    return None


def parse(path: Path) -> Any:
    """The file as a client reads it: YAML or TOML into a JSON value."""
    text = path.read_text(encoding="utf-8")
    return tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)


def errors(kind: str, data: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in Validator(schema(kind)).iter_errors(data)]


def shipped() -> list[tuple[str, Path]]:
    """(kind, file) of every host file, recipe and manifest the repository ships."""
    out = []
    for top in (REPO, *sorted(p.parent.parent for p in (REPO / "examples").glob("**/configs/host.yaml"))):
        for path in sorted(top.glob("configs/**/*")) + sorted(top.glob("manifests/*")):
            kind = kind_of(str(path.relative_to(top)))
            if kind and path.is_file():
                out.append((kind, path))
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_published_schema_is_the_generated_one(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    published = SCHEMAS / KINDS[kind][2]
    assert published.read_text(encoding="utf-8") == render(kind), (
        f"{published.relative_to(REPO)} differs from the model: run `make schemas` and commit the result"
    )
    assert main(["schema", kind]) == 0
    assert json.loads(capsys.readouterr().out) == schema(kind)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_schema_passes_the_meta_schema_and_describes_every_field(kind: str) -> None:
    doc = schema(kind)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(doc)
    missing = []
    for where, obj in [("(top)", doc), *doc.get("$defs", {}).items()]:
        for name, prop in obj.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{where}.{name}")
    assert not missing, f"fields without a description (Field(description=...) in reconciler/model/): {missing}"


def test_every_shipped_file_validates_and_points_at_its_schema() -> None:
    files = shipped()
    assert {k for k, _ in files} == set(KINDS) and len(files) >= 10
    for kind, path in files:
        assert errors(kind, parse(path)) == [], path
        first = path.read_text(encoding="utf-8").splitlines()[0]
        directive = "#:schema " if path.suffix == ".toml" else "# yaml-language-server: $schema="
        assert first.startswith(directive), f"{path.relative_to(REPO)}: line 1 should be {directive}..."
        target = (path.parent / first.removeprefix(directive)).resolve()
        # schemas/ links to the package's copies (reconciler/data/schemas/, which the wheel carries).
        assert target == (SCHEMAS / KINDS[kind][2]).resolve(), f"{path.relative_to(REPO)} points at {target}"


def root_files(root: Path) -> list[tuple[str, Path]]:
    """(kind, path) of the host file, each recipe and each manifest a root holds (a path may be a directory)."""
    found = [("host", root / "configs/host.yaml")]
    found += [("recipe", p) for p in sorted((root / "configs/recipes").glob("*.toml"))]
    found += [("manifest", p) for p in sorted((root / "manifests").glob("*.y*ml"))]
    return found


def verdict(root: Path) -> str:
    """ "refused" (the schema says no to a file), "unparsed" (a missing or non-regular file, bad encoding or
    syntax: no document to check) or "passes"."""
    for kind, path in root_files(root):
        if not path.is_file():
            return "unparsed"
        try:
            data = parse(path)
        except (UnicodeDecodeError, yaml.YAMLError, tomllib.TOMLDecodeError, RecursionError, ValueError):
            return "unparsed"
        if errors(kind, data):
            return "refused"
    return "passes"


def test_the_schema_refuses_the_bad_corpus_except_what_only_the_loader_can_tell(tmp_path: Path) -> None:
    from real.test_bad_corpus import ALL, BASE, build_root  # the corpus's own way of laying a case over its base

    base = tmp_path / "base"
    shutil.copytree(BASE, base)
    for f in base.rglob("*"):
        if f.is_file():
            f.write_text(f.read_text().replace("@SHM@", SHM))
    assert verdict(base) == "passes", [errors(k, parse(p)) for k, p in root_files(base)]
    verdicts = {case: verdict(build_root(case, tmp_path / case, Path(SHM))) for case in ALL}
    passing = {case for case, v in verdicts.items() if v == "passes"}
    assert passing - set(LOADER_ONLY) == set(), "the schema lets these through: tighten it, or list them with why"
    assert set(LOADER_ONLY) & set(verdicts) - passing == set(), (
        "listed as loader-only, but the schema refuses (or cannot parse) them: take them off the list"
    )
    refused = sum(v == "refused" for v in verdicts.values())
    assert refused >= 100, f"only {refused} of {len(verdicts)} cases refused by the schema"


def _check_jsonschema(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_CACHE")}
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--no-cache", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_an_editor_style_checker_passes_the_shipped_files_and_fails_a_broken_one(tmp_path: Path) -> None:
    meta = _check_jsonschema("--check-metaschema", *(str(SCHEMAS / k[2]) for k in KINDS.values()))
    assert meta.returncode == 0, meta.stdout + meta.stderr
    files = shipped()
    for kind in KINDS:
        paths = [str(p) for k, p in files if k == kind]
        ok = _check_jsonschema("--schemafile", str(SCHEMAS / KINDS[kind][2]), *paths)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    host = next(p for k, p in files if k == "host")
    broken = tmp_path / "host.yaml"
    broken.write_text(host.read_text().replace("pattern: vllm_offload_*.mmap", "pattern: '*'"))
    assert broken.read_text() != host.read_text()
    bad = _check_jsonschema("--schemafile", str(SCHEMAS / "host.schema.json"), str(broken))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "$.shm.pattern" in bad.stdout and "'*' does not match" in bad.stdout, bad.stdout
