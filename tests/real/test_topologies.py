"""Named topologies in a manifest (docs/design.md, "The files the operator writes"): ``topologies:`` a map of name to
assignments, ``topology:`` the one that runs. Every topology is validated as the running one is; ``assignments:``
alone stays one unnamed topology; the two forms together, or half of one, are refused with file, line and fix."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from real.test_loader import DEMO, point_shm_at
from reconciler.base.errors import ConfigError
from reconciler.load.desired import load_desired

SPLIT_AND_EXCLUSIVE = """\
host: demo
topology: split
topologies:
  split:
    - recipe: omni
      gpus: [dark-compute-b]
  exclusive:
    - recipe: deepseek-256k-offload
      gpus: [dark-compute-a, dark-compute-b]
"""


def demo_root(tmp_path: Path, shm: Path) -> Path:
    """A copy of the demo's root, its shm.dir on the tmpfs ``shm``."""
    shutil.copytree(DEMO / "configs", tmp_path / "configs")
    shutil.copytree(DEMO / "manifests", tmp_path / "manifests")
    point_shm_at(tmp_path, shm)
    return tmp_path


@pytest.fixture
def root(tmp_path: Path, shared_tmpfs: Path) -> Path:
    return demo_root(tmp_path, shared_tmpfs)


def manifest(root: Path, text: str) -> None:
    (root / "manifests" / "demo.yaml").write_text(textwrap.dedent(text))


def problems(root: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_desired(root)
    return [str(p) for p in info.value.problems]


def test_the_named_topology_runs_and_every_one_is_known(root: Path) -> None:
    manifest(root, SPLIT_AND_EXCLUSIVE)
    desired = load_desired(root)
    assert desired.topology == "split"
    assert [(a.recipe, a.slots) for a in desired.assignments] == [("omni", ("dark-compute-b",))]
    assert {n: [a.recipe for a in t] for n, t in desired.topologies.items()} == {
        "split": ["omni"],
        "exclusive": ["deepseek-256k-offload"],
    }
    manifest(root, SPLIT_AND_EXCLUSIVE.replace("topology: split", "topology: exclusive"))
    assert [a.slots for a in load_desired(root).assignments] == [("dark-compute-a", "dark-compute-b")]


def test_assignments_alone_is_one_unnamed_topology(root: Path) -> None:
    desired = load_desired(root)  # the demo's manifest
    assert desired.topology is None and desired.topologies == {} and desired.assignments


def test_a_topology_that_does_not_run_is_validated_too(root: Path) -> None:
    manifest(root, SPLIT_AND_EXCLUSIVE.replace("gpus: [dark-compute-a, dark-compute-b]", "gpus: [dark-compute-a]"))
    found = problems(root)
    assert len(found) == 1, found
    assert found[0].startswith("manifests/demo.yaml:9: topologies.exclusive[0].gpus: recipe 'deepseek-256k-offload'")
    assert "needs exactly that many GPU slots, got 1" in found[0]
    manifest(root, SPLIT_AND_EXCLUSIVE.replace("recipe: omni", "recipe: nothing"))
    assert "topologies.split[0].recipe: unknown recipe 'nothing'" in problems(root)[0]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (SPLIT_AND_EXCLUSIVE + "assignments:\n  - recipe: omni\n    gpus: [dark-compute-b]\n", "together: keep one"),
        (SPLIT_AND_EXCLUSIVE.replace("topology: split\n", ""), "needs topology: NAME"),
        (SPLIT_AND_EXCLUSIVE.replace("topology: split", "topology: other"), "'other' is not under topologies:"),
        ("host: demo\ntopology: split\nassignments: []\n", "no topologies: map"),
        (
            SPLIT_AND_EXCLUSIVE.replace("  split:", "  Split:").replace("topology: split", "topology: Split"),
            "is not a name",
        ),
    ],
)
def test_half_a_form_or_both_is_refused_with_the_fix(root: Path, text: str, says: str) -> None:
    manifest(root, text)
    found = problems(root)
    assert len(found) == 1 and says in found[0] and found[0].startswith("manifests/demo.yaml"), found
