"""The package without the checkout: ``python -m build`` makes an sdist and a wheel of a copy of this tree, and the
wheel carries everything the tool reads at run time (the systemd unit, the Prometheus rule file, the operator's
files' JSON Schemas), the same bytes as the checkout's paths that link to them, and nothing of tests/ or examples/.
Unpacked alone, away from the checkout, the wheel's code prints its unit and its rules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the tool reads from its own package at run time, and the checkout's path for each (a link to it).
DATA = {
    "reconciler/data/reconciler.service": "examples/reconciler.service",
    "reconciler/data/prometheus/alerts.yml": "configs/prometheus/alerts.yml",
    "reconciler/data/schemas/host.schema.json": "schemas/host.schema.json",
    "reconciler/data/schemas/recipe.schema.json": "schemas/recipe.schema.json",
    "reconciler/data/schemas/manifest.schema.json": "schemas/manifest.schema.json",
}
_SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel of a copy of this tree (the checkout itself gets no build/ or egg-info)."""
    base = tmp_path_factory.mktemp("dist")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=_SKIP, symlinks=True)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(base / "out"), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if "No module named build" in done.stderr:
        pytest.fail("python -m build: the module 'build' is missing; `make setup` installs the test tools (.[test])")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return base / "out"


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_the_wheel_carries_the_run_time_data_and_no_tests(dist: Path) -> None:
    wheel = _one(dist, "reconciler-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for inside, checkout in DATA.items():
            assert inside in names, f"{inside} is not in {wheel.name}"
            assert z.read(inside) == (REPO / checkout).read_bytes(), f"{inside} differs from {checkout}"
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"reconciler", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert "reconciler = reconciler.cli:main" in entry_points
    assert "reconciler/cli/install.py" in names and "reconciler/mcp_server.py" in names


def test_the_sdist_builds_the_wheel_and_holds_the_data(dist: Path) -> None:
    sdist = _one(dist, "reconciler-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for inside in DATA:
        assert inside in names, f"{inside} is not in {sdist.name}"
    assert {"pyproject.toml", "README.md"} <= names
    assert not any(n.startswith((".venv", ".git/")) or "__pycache__" in n for n in names)


def test_the_unpacked_wheel_prints_its_unit_and_rules_away_from_the_checkout(dist: Path, tmp_path: Path) -> None:
    wheel = _one(dist, "reconciler-*-py3-none-any.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # -I: neither the checkout (the test's PYTHONPATH) nor the current directory is on the path; the
        # interpreter's own site-packages still give the dependencies.
        code = f"import sys; sys.path.insert(0, {str(site)!r}); from reconciler.cli import main; sys.exit(main())"
        return subprocess.run(
            [sys.executable, "-I", "-c", code, *args], capture_output=True, text=True, cwd=elsewhere, timeout=60
        )

    where = run("--version")
    assert where.returncode == 0, where.stderr
    rules = run("alert-rules")
    assert rules.returncode == 0, rules.stderr
    assert rules.stdout == (REPO / "configs" / "prometheus" / "alerts.yml").read_text()
    unit = run("--root", "/etc/reconciler", "systemd-unit", "--exec", "/opt/pipx/venvs/reconciler/bin/reconciler")
    assert unit.returncode == 0, unit.stderr
    assert unit.stdout == (REPO / "examples" / "reconciler.service").read_text()
    which = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(site)!r}); import reconciler; print(reconciler.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=elsewhere,
    )
    assert which.stdout.strip() == str(site / "reconciler" / "__init__.py")
