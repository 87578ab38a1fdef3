"""The markers follow the fixtures (tests/conftest.py): `-m "not docker"` collects no test that takes a real-engine
fixture, wherever it is, and `-m docker` collects them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


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
    for name in ("tests/attack/test_listener.py", "tests/attack/test_secret_values.py", "tests/test_loop.py"):
        assert name in with_engine, name
    assert not {n for n in without if n.startswith("tests/attack/test_listener")}, without
    assert "tests/test_planner_cases.py" in without and "tests/test_planner_cases.py" not in with_engine
