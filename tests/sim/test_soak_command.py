"""``make soak``'s command (tests/sim/soak.py) as a whole process: it takes its settings from the environment alone,
so ``--help`` prints them and any other argument is refused, and neither starts a soak (which would take every core
for minutes); a small run prints its seed's line and the total."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent / "soak.py"
RAN = re.compile(r"\d+ steps, \d+ invariant violations")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SOAK), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_help_prints_the_settings_and_runs_nothing() -> None:
    done = _run("--help", SOAK_STEPS="100000000")
    assert done.returncode == 0
    assert "SOAK_SEEDS" in done.stdout and "steps/s" in done.stdout
    assert not RAN.search(done.stdout)  # no run's line: nothing ran


def test_an_argument_is_refused_and_runs_nothing() -> None:
    done = _run("--steps", "5", SOAK_STEPS="100000000")
    assert done.returncode == 2
    assert "SOAK_STEPS" in done.stderr
    assert not RAN.search(done.stdout + done.stderr)


def test_a_small_run_prints_its_seed_and_the_total() -> None:
    done = _run(SOAK_SEEDS="7 8", SOAK_STEPS="100", SOAK_WORKERS="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 invariant violations, seed 7" in done.stdout and "0 invariant violations, seed 8" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("total: ")
