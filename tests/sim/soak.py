"""``make soak``: the simulated host for a long budget. ``SOAK_STEPS`` (default 1,000,000) steps in all, spread over
``SOAK_WORKERS`` processes (default: the CPU count), from ``SOAK_SEED`` (default: random; printed, so a run replays
with it). Ends with one line: ``N steps, V invariant violations, seed S, R steps/s``. A failing run prints hypothesis's
shrunk sequence of steps: make it a regression case (tests/cases/plan/, or a test beside tests/test_sim.py).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the sim package

STEPS_PER_EXAMPLE = 50
BATCH_EXAMPLES = 200


def _worker(args: tuple[int, int]) -> tuple[int, int, str]:
    """Run machines until ``budget`` steps are done; (steps, violations, report of the first failure). Hypothesis
    runs a batch of examples at a time, each batch from its own seed: its memory of the run stays bounded."""
    seed, budget = args
    from hypothesis import HealthCheck, settings
    from hypothesis import seed as hseed
    from hypothesis.stateful import run_state_machine_as_test

    from sim.machine import STEPS, HostMachine

    batch = 0
    while STEPS[0] < budget:
        examples = max(1, min(BATCH_EXAMPLES, (budget - STEPS[0]) // STEPS_PER_EXAMPLE))
        machine = hseed(seed * 100_000 + batch)(HostMachine)
        batch += 1
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=STEPS_PER_EXAMPLE,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except BaseException as exc:  # noqa: BLE001 - a violation: report it with hypothesis's shrunk steps
            import traceback

            return (
                STEPS[0],
                1,
                f"batch seed {seed * 100_000 + batch - 1}:\n" + "".join(traceback.format_exception(exc))[-6000:],
            )
    return STEPS[0], 0, ""


def main() -> int:
    total = int(os.environ.get("SOAK_STEPS", "1000000"))
    workers = int(os.environ.get("SOAK_WORKERS", str(os.cpu_count() or 1)))
    seed = int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(2**32))
    t0 = time.monotonic()
    jobs = [(seed + i, -(-total // workers)) for i in range(workers)]
    if workers == 1:
        results = [_worker(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_worker, jobs)
    steps = sum(r[0] for r in results)
    violations = sum(r[1] for r in results)
    for _, _, report in results:
        if report:
            print(report)
    rate = steps / max(1e-9, time.monotonic() - t0)
    print(f"{steps} steps, {violations} invariant violations, seed {seed}, {rate:.0f} steps/s")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
