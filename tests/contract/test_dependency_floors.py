"""The dependency floors of pyproject.toml are true: .ci/lowest.txt pins each dependency (test extras included) at
its floor, and .ci/run installs exactly those pins into a second venv and runs the tests there.

With RECONCILER_LOWEST=1 (set by that run) the installed versions are checked to be the pins, so the run cannot
quietly test newer versions.
"""

from __future__ import annotations

import os
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]]


def pins() -> dict[str, Version]:
    out = {}
    for line in (REPO / ".ci" / "lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = Version(version)
    return out


def test_lowest_txt_pins_every_dependency_at_its_floor() -> None:
    pinned = pins()
    reqs = requirements()
    assert set(pinned) == {canonicalize_name(r.name) for r in reqs}, "one pin per dependency, no others"
    for r in reqs:
        v = pinned[canonicalize_name(r.name)]
        assert v in r.specifier, f"{r.name}=={v} is not allowed by {r}"
        [floor] = [Version(s.version) for s in r.specifier if s.operator == ">="]
        # The floor itself, or its first release where the floor names no release of its own (12.535 -> 12.535.77).
        assert v.release[: len(floor.release)] == floor.release, f"{r.name}: pinned {v}, but the floor is {floor}"


@pytest.mark.skipif(os.environ.get("RECONCILER_LOWEST") != "1", reason="only in the lowest-versions run (.ci/run)")
def test_the_lowest_versions_run_has_the_pins_installed() -> None:
    for name, v in pins().items():
        assert Version(metadata.version(name)) == v, f"{name} {metadata.version(name)} installed, {v} pinned"
