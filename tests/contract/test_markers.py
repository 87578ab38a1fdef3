"""The markers follow the fixtures (tests/conftest.py): `-m "not docker"` collects no test that takes a real-engine
fixture, wherever it is, and `-m docker` collects them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _collected(expr: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", expr, str(TESTS)],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        check=False,
    ).stdout
    return {line.split("::")[0] for line in out.splitlines() if "::" in line}


def test_not_docker_leaves_out_every_real_engine_test() -> None:
    without = _collected("not docker")
    with_engine = _collected("docker")
    # files whose tests take the engine's fixtures without marking themselves
    for name in ("tests/attack/test_listener.py", "tests/attack/test_secret_values.py", "tests/real/test_loop.py"):
        assert name in with_engine, name
    assert not {n for n in without if n.startswith("tests/attack/test_listener")}, without
    assert "tests/unit/test_planner_cases.py" in without and "tests/unit/test_planner_cases.py" not in with_engine


# The kinds of test, each a folder (README, "Layout"): what a file needs tells where it sits.
KINDS = {"unit", "real", "sim", "contract", "attack"}


def test_every_test_file_sits_in_the_folder_of_its_kind() -> None:
    """No test file outside the kinds' folders, and none in ``unit/`` takes a fixture of a real part (the engine, a
    tmpfs mount, a GPU): a unit test that reached the world would belong in ``real/``."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], f"test files outside a kind's folder ({', '.join(sorted(KINDS))}): {loose}"
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders <= KINDS, folders - KINDS
    real_parts = _collected("docker or root or gpu")
    assert not {n for n in real_parts if n.startswith("tests/unit/")}, sorted(real_parts)
    assert any(n.startswith("tests/real/") for n in real_parts) and _collected("not docker") >= {
        "tests/unit/test_planner_cases.py"
    }
