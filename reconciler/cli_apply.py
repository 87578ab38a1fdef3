"""``reconciler apply``: one converge pass with the plan shown first. Exit 0 converged, 3 blocked, 1 failed.

Registered by ``reconciler.cli``. Holds the host lock for the pass; SIGINT/SIGTERM abandon the current action at a
safe point (everything created already carries its labels) and exit non-zero.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from reconciler.cli import EXIT_ERROR, emit_json
from reconciler.errors import ReconcilerError
from reconciler.fingerprint import PLAN_FORMAT, Fingerprint, file_digests, observed_parts
from reconciler.loader import load_desired

if TYPE_CHECKING:
    from reconciler.planner import Plan


APPROVAL_HELP = (
    "apply changes the host only when approved: answer its prompt on a terminal, pass --yes, or save a plan with "
    "`reconciler plan --out FILE` and run `reconciler apply FILE`"
)


def _read_plan_file(path: str) -> tuple[dict[str, Any], Fingerprint]:
    """A saved plan (``reconciler plan --out``) and its fingerprint; ReconcilerError when it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ReconcilerError(f"{path}: no such plan file (write one with `reconciler plan --out {path}`)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ReconcilerError(f"{path}: not a saved plan ({exc}); write one with `reconciler plan --out FILE`") from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise ReconcilerError(f"{path}: not a saved plan of this tool (format {PLAN_FORMAT!r} expected)")
    try:
        return data, Fingerprint.from_json(data.get("fingerprint") or {})
    except ValueError as exc:
        raise ReconcilerError(f"{path}: {exc}") from None


def _stale(changes: list[str], what: str, new: Plan, observed: Any, args: argparse.Namespace) -> int:
    """Refuse a plan whose inputs changed: say what changed and show the plan as it would be now. Exit 1."""
    from reconciler.render import Style, render_plan

    if args.json:
        emit_json({"host": new.host, "result": "stale", "message": what, "changes": changes, "plan": new.to_json()})
    else:
        print(f"{what}; nothing was changed. What changed:", file=sys.stderr)
        for line in changes[:40]:
            print(f"  {line}", file=sys.stderr)
        if len(changes) > 40:
            print(f"  ... and {len(changes) - 40} more", file=sys.stderr)
        print("The plan now:", file=sys.stderr)
        print(render_plan(new, observed, Style(sys.stderr)), file=sys.stderr)
    return EXIT_ERROR


def cmd_apply(args: argparse.Namespace) -> int:
    from reconciler.apply import Applier
    from reconciler.lock import HostLock
    from reconciler.progress import TerminalProgress
    from reconciler.render import Style, render_plan

    # The files' digests are taken before they are loaded: an edit in between makes the plan look stale
    # (refused, shown again), never fresh.
    files_before = file_digests(args.root)
    desired = load_desired(args.root)
    saved = _read_plan_file(args.plan_file) if args.plan_file else None
    if saved is not None and saved[0].get("host") != desired.host.name:
        raise ReconcilerError(
            f"{args.plan_file}: a plan for host {saved[0].get('host')!r}, but {args.root} is host {desired.host.name!r}"
        )
    cancel = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        cancel.set()
        print(f"\n{signal.Signals(signum).name}: finishing at the next safe point", file=sys.stderr)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with HostLock(desired.host.name, command="apply"):
            applier = Applier(desired, progress=TerminalProgress(quiet=args.json), cancel=cancel)
            observed, first = applier.plan_now()
            shown = Fingerprint(files_before, observed_parts(observed))
            if saved is not None:
                changes = shown.changes_since(saved[1])
                if changes:
                    return _stale(changes, f"the saved plan {args.plan_file} is stale", first, observed, args)
            elif not args.json:
                print(render_plan(first, observed, Style()))
                sys.stdout.flush()  # the plan comes before the progress lines (stderr), also when piped
            acts = bool(first.actions) and not first.blocked and not first.unavailable
            if acts and saved is None and not args.yes:
                if args.json or not sys.stdin.isatty():
                    why = "--json never prompts" if args.json else "no terminal to ask on"
                    print(f"error: {why}; nothing was changed. {APPROVAL_HELP}", file=sys.stderr)
                    return EXIT_ERROR
                answer = input(f"Apply {len(first.actions)} action(s)? [y/N] ").strip().lower()
                if answer not in ("y", "yes"):
                    print("nothing changed", file=sys.stderr)
                    return EXIT_ERROR
                # What runs is what was shown: a change while the prompt waited means another plan.
                observed, now = applier.plan_now()
                changes = Fingerprint(file_digests(args.root), observed_parts(observed)).changes_since(shown)
                if changes:
                    return _stale(changes, "the host or its files changed while the plan waited for approval",
                                  now, observed, args)
                first = now
            result = applier.converge(start=(observed, first), approved=first)
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


def cmd_adopt(args: argparse.Namespace) -> int:
    """Make containers that carry this host's labels but no install id (made by an earlier version of this tool)
    this install's, by name or id. Explicit and logged: nothing is ever adopted silently."""
    from reconciler import state
    from reconciler.lock import HostLock
    from reconciler.observe.docker_obs import DockerObserver
    from reconciler.planner import owner_kind

    desired = load_desired(args.root)
    host = desired.host.name
    with HostLock(host, command="adopt"):
        containers, source = DockerObserver(desired.host.docker.url).observe()
        if not source.ok:
            raise ReconcilerError(f"docker source unavailable: {source.detail}; nothing adopted")
        own = state.read_ownership(host)
        picked = []
        for want in args.containers:
            found = [c for c in containers if want in (c.name, c.id) or (len(want) >= 12 and c.id.startswith(want))]
            if len(found) != 1:
                raise ReconcilerError(f"{want}: {'no' if not found else 'more than one'} container of that name or id; nothing adopted")
            c = found[0]
            kind = owner_kind(c, host, own)
            if kind == "ours":
                print(f"{c.name} ({c.id[:12]}) is this install's already", file=sys.stderr)
            elif kind == "foreign":
                raise ReconcilerError(
                    f"{c.name} ({c.id[:12]}) is not a container this tool made for host {host!r} (it lacks this "
                    "host's labels of its own, or carries another install's id); it cannot be adopted. Nothing adopted"
                )
            else:
                picked.append(c)
        if picked:
            install_id = state.ensure_install_id(host)
            state.adopt(host, [c.id for c in picked], existing=[c.id for c in containers])
            for c in picked:
                state.record(host, {"event": "adopt", "container": c.name, "id": c.id, "install_id": install_id,
                                    "recipe": c.recipe, "slots": list(c.slots)})
                print(f"adopted {c.name} ({c.id[:12]}, {c.recipe or 'no recipe'} on {','.join(c.slots) or 'no slot'})")
    if args.json:
        emit_json({"host": host, "adopted": [{"name": c.name, "id": c.id} for c in picked]})
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from reconciler.backoff import Backoff
    from reconciler.errors import ReconcilerError
    from reconciler.loop import Log, Loop

    loop = Loop(
        args.root,
        metrics_addr=args.metrics_addr or None,
        resync_s=args.resync,
        debounce_s=args.debounce,
        log=Log(args.log_format),
        backoff=Backoff(base_s=args.backoff_base, max_s=args.backoff_max),
    )
    try:
        return loop.run()
    except ReconcilerError as exc:
        # Before the loop could start (the host lock, the metrics address): one log line in the loop's own
        # format, so a supervisor reading JSON sees why, and exit 1 (never a traceback).
        loop.log("exit", reason="cannot start", error=str(exc))
        return EXIT_ERROR


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "apply", parents=parents, help="one converge pass (0 converged, 3 blocked, 1 failed)"
    )
    p.add_argument(
        "plan_file", nargs="?", metavar="FILE",
        help="a plan saved by `reconciler plan --out FILE`: apply exactly it, refused when the host or files changed",
    )
    p.add_argument("--yes", "-y", action="store_true", help="approve the plan shown without asking (needed without a terminal)")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser(
        "adopt", parents=parents,
        help="make containers with this host's labels but no install id (an earlier version's) this install's",
    )
    p.add_argument("containers", nargs="+", metavar="CONTAINER", help="name or id")
    p.set_defaults(func=cmd_adopt)

    p = sub.add_parser("run", parents=parents, help="the loop: watch and converge, serve /metrics and /healthz")
    p.add_argument("--metrics-addr", default="127.0.0.1:9464", help="HOST:PORT for /metrics and /healthz ('' = off)")
    p.add_argument("--resync", type=float, default=60.0, metavar="SECONDS", help="look again at least this often")
    p.add_argument("--debounce", type=float, default=0.1, metavar="SECONDS", help="quiet time after a file event")
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="one line per event")
    p.add_argument("--backoff-base", type=float, default=10.0, metavar="SECONDS", help="first delay after a failed enter")
    p.add_argument("--backoff-max", type=float, default=600.0, metavar="SECONDS", help="longest delay between enters")
    p.set_defaults(func=cmd_run)
