"""``make soak``: the simulated host for a long budget. ``SOAK_STEPS`` (default 1,000,000) steps in all.

From one seed, ``SOAK_SEED`` (default: random; printed, so a run replays with it): the steps spread over
``SOAK_WORKERS`` processes (default: the CPU count), worker i from seed S + i, and one line at the end:
``N steps, V invariant violations, seed S, R steps/s``.

From many, ``SOAK_SEEDS``: a list ("1 2 3", spaces or commas) or a count ("8": that many seeds drawn and printed);
each seed an independent run of its share of the steps, the ``SOAK_WORKERS`` processes taking seeds off the list.
One line per seed as above (R that seed's own rate), as each seed finishes, then a total line:
``total: N steps, V invariant violations, K seeds, R steps/s``.

``SOAK_MACHINE=door`` runs ``sim.door_machine.DoorHostMachine`` instead: the front door open from the start of every
run and only the steps that bear on it, so its invariants (l) and (m) meet its clients, looks, demand switches and the
drains that wait for it often (``SIM_DOOR_SHARE``, the share of ``HostMachine``'s runs that start with the door, is
then -1: every run).

``SOAK_SECONDS`` (optional) bounds the wall time: a seed still running then stops after its current batch of
examples (every step it ran was checked) and its line says ``stopped at the time bound``; the total counts the steps
run. For a machine lent for a fixed time: ``SOAK_SEEDS=16 SOAK_STEPS=20000000 SOAK_SECONDS=500``.

A failing run prints hypothesis's sequence of steps of the first failing seed as soon as it fails (the others' lines
still printed after it), as drawn: a shrink can take minutes, past a lent machine's time, so it is left to
``SOAK_SHRINK=1`` (replay the printed batch seed with ``SOAK_SEEDS`` and it) before making it a regression case (tests/cases/plan/, or a test beside tests/sim/test_sim.py). The exit code is 1 on any
violation, 2 when what the simulation needs cannot be imported or an argument is given (nothing was run: the soak
takes its settings from the environment alone; ``--help`` prints this).
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
# Examples a batch: the time bound is looked at between batches, so a batch is kept short (some 2,500 steps: under
# 10 s at the 16-core machine's 300 steps/s a worker; with batches of 200, two seeds there ran over 80 s past the
# bound, past the call's own time limit, and reported nothing).
BATCH_EXAMPLES = 50


def _worker(args: tuple[int, int, float | None]) -> tuple[int, int, str, float, int]:
    """Run machines until ``budget`` steps are done or the monotonic ``deadline`` has passed; (steps, violations,
    report of the first failure, seconds taken, seed). Hypothesis runs a batch of examples at a time, each batch from
    its own seed: its memory of the run stays bounded."""
    seed, budget, deadline = args
    t0 = time.monotonic()
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as hseed
    from hypothesis.stateful import run_state_machine_as_test

    from sim.machine import STEPS, HostMachine

    if os.environ.get("SOAK_MACHINE", "") == "door":
        from sim import door_steps
        from sim.door_machine import DoorHostMachine as HostMachine  # type: ignore[assignment]

        door_steps.DOOR_SHARE[0] = -1
    STEPS[0] = 0  # a pool's process runs one seed after another
    batch = 0
    while STEPS[0] < budget and (deadline is None or time.monotonic() < deadline):
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
                    # No shrinking unless asked: a shrink can outlast the soak's time bound (minutes), and a run cut
                    # there reports nothing; the steps as drawn replay from the printed batch seed.
                    phases=list(Phase) if os.environ.get("SOAK_SHRINK") == "1" else [Phase.generate],
                ),
            )
        except BaseException as exc:  # noqa: BLE001 - a violation: report it with hypothesis's shrunk steps
            import traceback

            # The violation's own message first: the traceback's tail (hypothesis's shrunk steps) can be long.
            return (
                STEPS[0],
                1,
                f"seed {seed}, batch seed {seed * 100_000 + batch - 1}: {type(exc).__name__}: {str(exc)[:3000]}\n"
                + "".join(traceback.format_exception(exc))[-6000:],
                time.monotonic() - t0,
                seed,
            )
    return STEPS[0], 0, "", time.monotonic() - t0, seed


def _line(steps: int, violations: int, seed: int, rate: float, cut: bool = False) -> str:
    tail = ", stopped at the time bound" if cut else ""
    return f"{steps} steps, {violations} invariant violations, seed {seed}, {rate:.0f} steps/s{tail}"


def _deadline() -> float | None:
    text = os.environ.get("SOAK_SECONDS", "").strip()
    return time.monotonic() + float(text) if text else None


def _seeds(text: str) -> list[int]:
    """``SOAK_SEEDS``: several seeds as listed, or one number: that many drawn (at random, printed)."""
    words = text.replace(",", " ").split()
    if len(words) == 1:
        rng = random.SystemRandom()
        return [rng.randrange(2**32) for _ in range(int(words[0]))]
    return [int(w) for w in words]


def _many(seeds: list[int], total: int, workers: int) -> int:
    t0 = time.monotonic()
    share = -(-total // len(seeds))
    deadline = _deadline()
    jobs = [(s, share, deadline) for s in seeds]
    print(f"soak: {len(seeds)} seeds ({' '.join(map(str, seeds))}), {share} steps each, {workers} workers", flush=True)
    first = ""
    steps = violations = 0
    with multiprocessing.get_context("fork").Pool(min(workers, len(seeds))) as pool:
        for n, v, report, took, seed in pool.imap_unordered(_worker, jobs):
            print(_line(n, v, seed, n / max(1e-9, took), cut=n < share and not v), flush=True)
            if report and not first:
                print(report, flush=True)  # at once: a run cut short by its caller still shows the steps
            steps, violations = steps + n, violations + v
            first = first or report
    rate = steps / max(1e-9, time.monotonic() - t0)
    print(f"total: {steps} steps, {violations} invariant violations, {len(seeds)} seeds, {rate:.0f} steps/s")
    return 1 if violations else 0


def main() -> int:
    if sys.argv[1:]:  # set by the environment alone (the docstring): an argument is a mistake, --help included
        print(__doc__, file=sys.stdout if sys.argv[1:] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    try:  # a run that cannot import the simulation stops here, before any worker counts it a violation
        import hypothesis  # noqa: F401

        import reconciler  # noqa: F401
        from sim import machine  # noqa: F401
    except ImportError as exc:
        print(
            f"soak: cannot import what the simulation needs ({exc}): install the package and its test extras "
            "(make setup), or put the repository on PYTHONPATH",
            file=sys.stderr,
        )
        return 2
    total = int(os.environ.get("SOAK_STEPS", "1000000"))
    workers = int(os.environ.get("SOAK_WORKERS", str(os.cpu_count() or 1)))
    if os.environ.get("SOAK_SEEDS", "").strip():
        return _many(_seeds(os.environ["SOAK_SEEDS"]), total, workers)
    seed = int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(2**32))
    t0 = time.monotonic()
    deadline = _deadline()
    jobs = [(seed + i, -(-total // workers), deadline) for i in range(workers)]
    if workers == 1:
        results = [_worker(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_worker, jobs)
    steps = sum(r[0] for r in results)
    violations = sum(r[1] for r in results)
    for _, _, report, _took, _seed in results:
        if report:
            print(report)
            break
    rate = steps / max(1e-9, time.monotonic() - t0)
    print(_line(steps, violations, seed, rate))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
