"""``reconciler apply``: one converge pass with the plan shown first. Exit 0 converged, 3 blocked, 1 failed.

Registered by ``reconciler.cli``. Holds the host lock for the pass; SIGINT/SIGTERM abandon the current action at a
safe point (everything created already carries its labels) and exit non-zero.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from reconciler.cli import EXIT_ERROR, emit_json
from reconciler.loader import load_desired


def cmd_apply(args: argparse.Namespace) -> int:
    from reconciler.apply import Applier
    from reconciler.lock import HostLock
    from reconciler.progress import TerminalProgress
    from reconciler.render import Style, render_plan

    desired = load_desired(args.root)
    cancel = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        cancel.set()
        print(f"\n{signal.Signals(signum).name}: finishing at the next safe point", file=sys.stderr)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with HostLock(desired.host.name, command="apply"):
            applier = Applier(desired, progress=TerminalProgress(quiet=args.json), cancel=cancel)
            observed, first = applier.plan_now()
            if not args.json:
                print(render_plan(first, observed, Style()))
            if first.actions and not first.blocked and not first.unavailable and not args.yes and sys.stdin.isatty():
                answer = input(f"Apply {len(first.actions)} action(s)? [y/N] ").strip().lower()
                if answer not in ("y", "yes"):
                    print("nothing changed", file=sys.stderr)
                    return EXIT_ERROR
            result = applier.converge(start=(observed, first))
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if args.json:
        emit_json(result.to_json())
    else:
        s = Style()
        if result.result == "converged":
            print(s.green(f"converged in {result.seconds:.1f}s ({len(result.outcomes)} action(s))"))
        elif result.result == "blocked":
            print(s.red(f"blocked: {result.message}"), file=sys.stderr)
        else:
            print(s.red(f"{result.result}: {result.message}"), file=sys.stderr)
    return result.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    from reconciler.backoff import Backoff
    from reconciler.loop import Log, Loop

    loop = Loop(
        args.root,
        metrics_addr=args.metrics_addr or None,
        resync_s=args.resync,
        debounce_s=args.debounce,
        log=Log(args.log_format),
        backoff=Backoff(base_s=args.backoff_base, max_s=args.backoff_max),
    )
    return loop.run()


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "apply", parents=parents, help="one converge pass (0 converged, 3 blocked, 1 failed)"
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation on a terminal")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("run", parents=parents, help="the loop: watch and converge, serve /metrics and /healthz")
    p.add_argument("--metrics-addr", default="127.0.0.1:9464", help="HOST:PORT for /metrics and /healthz ('' = off)")
    p.add_argument("--resync", type=float, default=60.0, metavar="SECONDS", help="look again at least this often")
    p.add_argument("--debounce", type=float, default=0.1, metavar="SECONDS", help="quiet time after a file event")
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="one line per event")
    p.add_argument("--backoff-base", type=float, default=10.0, metavar="SECONDS", help="first delay after a failed enter")
    p.add_argument("--backoff-max", type=float, default=600.0, metavar="SECONDS", help="longest delay between enters")
    p.set_defaults(func=cmd_run)
