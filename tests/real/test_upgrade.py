"""An upgrade restarts no lane (docs/design.md, "The recipe's hash across releases"): the last release, installed
from its wheel into a fresh virtual environment, brings a lane up on the real engine; this tree's wheel is installed
over it, then a next release's (this tree with one more recipe key, defaulted, as a release that adds a key makes
it); after each, ``plan`` has nothing to do and the lane is the same container, by its id.

The wheels are built once per session, side by side: the last release's from its commit (``git archive``, so a test
cut short leaves no worktree registered in the checkout), this tree's from a copy of it. The environment gets the
wheel alone (``pip install --no-deps --no-index``); its dependencies are the running interpreter's own, named by a
``.pth`` file, so nothing is fetched.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_helpers import CliResult, Root

REPO = Path(__file__).resolve().parents[2]
# The release before recipe hashes left defaults out (hash version 1's key set): the one users' lanes carry hashes of.
LAST_RELEASE = "28560f7"
_SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
# What the next release adds, in the copy of this tree only: a container key with a default, written by no recipe.
_ANCHOR = '    @field_validator("image")\n'
_NEXT_KEY = '    next_release_key: int = Field(default=0, description="A key a later release adds (tests/real/test_upgrade.py).")\n\n'


@dataclass(frozen=True)
class Wheels:
    last: Path
    this: Path
    next: Path


def _build(src: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    base = tmp_path_factory.mktemp("upgrade-wheels")
    last = base / "last"
    last.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", LAST_RELEASE], capture_output=True, timeout=60)
    if archive.returncode != 0:
        pytest.fail(
            f"git archive {LAST_RELEASE}: {archive.stderr.decode()[-500:]} (a full clone of the repository holds it)"
        )
    subprocess.run(["tar", "-x", "-C", str(last)], input=archive.stdout, check=True, timeout=60)
    this = base / "this"
    shutil.copytree(REPO, this, ignore=_SKIP, symlinks=True)
    nxt = base / "next"
    shutil.copytree(this, nxt, symlinks=True)
    recipe_py = nxt / "reconciler" / "model" / "recipe.py"
    text = recipe_py.read_text()
    assert text.count(_ANCHOR) == 1, f"{_ANCHOR.strip()} is no longer in recipe.py: anchor the next release's key anew"
    recipe_py.write_text(text.replace(_ANCHOR, _NEXT_KEY + _ANCHOR))
    procs = {name: _build(src, base / "out" / name) for name, src in (("last", last), ("this", this), ("next", nxt))}
    found = {}
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"python -m build of {name}: {output[-3000:]}"
        [found[name]] = sorted((base / "out" / name).glob("reconciler-*-py3-none-any.whl"))
    return Wheels(**found)


class Venv:
    """A fresh virtual environment with no package of its own but the wheel installed into it."""

    def __init__(self, path: Path):
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
        [sp] = path.glob("lib/python*/site-packages")
        (sp / "dependencies.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # never this checkout's code

    def install(self, wheel: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(self.path / "bin" / "python"),
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                "--force-reinstall",
                str(wheel),
            ],
            check=True,
            env=self.env,
            timeout=300,
        )

    def imports(self, module: str) -> bool:
        done = subprocess.run(
            [str(self.path / "bin" / "python"), "-c", f"import {module}"], env=self.env, cwd=self.path
        )
        return done.returncode == 0

    def reconciler(self, root: Root, *args: str) -> CliResult:
        argv = [str(self.path / "bin" / "reconciler"), "--root", str(root.path), *args]
        env = {**root.env, **{k: v for k, v in self.env.items() if k not in root.env}}
        env.pop("PYTHONPATH", None)
        p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.path, timeout=120)
        return CliResult(tuple(args), p.returncode, p.stdout, p.stderr)


def _running(root: Root) -> list[dict[str, object]]:
    return [c for c in root.containers() if c["State"] == "running"]


def _expect(res: CliResult, rc: int) -> CliResult:
    assert res.rc == rc, str(res)
    return res


def _nothing_to_do(venv: Venv, root: Root, lane: dict[str, object], hashes: Sequence[str]) -> None:
    plan = _expect(venv.reconciler(root, "plan", "--json"), 0).data
    assert plan["actions"] == [] and not plan["changes"], plan
    _expect(venv.reconciler(root, "apply", "--yes", "--json"), 0)
    [now] = _running(root)
    assert now["Id"] == lane["Id"], "the upgrade recreated the lane"
    assert now["Labels"]["io.reconciler.recipe-hash"] in hashes
    [assignment] = _expect(venv.reconciler(root, "validate", "--json"), 0).data["assignments"]
    assert assignment["recipe_hash"] == lane["Labels"]["io.reconciler.recipe-hash"], "the hash moved"


def test_an_upgrade_restarts_no_lane(root: Root, wheels: Wheels, tmp_path: Path) -> None:
    venv = Venv(tmp_path / "venv")
    venv.install(wheels.last)
    assert not venv.imports("reconciler.model.recipe_hash"), "the last release is installed"
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-a"]))
    _expect(venv.reconciler(root, "apply", "--yes", "--json"), 0)
    [lane] = _running(root)
    labels = lane["Labels"]
    assert isinstance(labels, dict)
    assert "io.reconciler.hash-version" not in labels, "the last release labels no hash version"

    venv.install(wheels.this)
    assert venv.imports("reconciler.model.recipe_hash"), "this tree is installed"
    _nothing_to_do(venv, root, lane, [labels["io.reconciler.recipe-hash"]])

    venv.install(wheels.next)
    assert venv.imports("reconciler.model.recipe_hash") and _has_next_key(venv), "the next release is installed"
    _nothing_to_do(venv, root, lane, [labels["io.reconciler.recipe-hash"]])


def _has_next_key(venv: Venv) -> bool:
    code = "from reconciler.model import ContainerSpec; assert 'next_release_key' in ContainerSpec.model_fields"
    done = subprocess.run([str(venv.path / "bin" / "python"), "-c", code], env=venv.env, cwd=venv.path)
    return done.returncode == 0
