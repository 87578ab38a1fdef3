"""The handlers of ``reconciler apply``, ``switch``, ``promote``, ``sync``, ``adopt``, ``prune`` and ``probe``
(registered by ``reconciler.cli.apply``): one converge pass with the plan shown first, and the commands that change
or read the host through the service beside it. Loaded when one of them runs.

Holds the host lock for the pass; SIGINT/SIGTERM abandon the current action at a safe point (everything created
already carries its labels) and exit non-zero. When the running loop carries out an apply for a client
(``reconciler.control``), it holds the loop's pass lock instead, lets passes run while the prompt waits for its
answer, and the client's Ctrl-C is the safe stop.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from reconciler.base.terminal import emit_json
from reconciler.cli.commands.host import service
from reconciler.cli.common import EXIT_ERROR, console
from reconciler.cli.render import render_plan, render_source
from reconciler.loop.progress import TerminalProgress
from reconciler.service import ApplyResult

APPROVAL_HELP = (
    "apply changes the host only when approved: answer its prompt on a terminal, pass --yes, or save a plan with "
    "`reconciler plan --out FILE` and run `reconciler apply FILE`"
)


def _stale(res: ApplyResult, args: argparse.Namespace) -> int:
    """A plan whose inputs changed: say what changed and show the plan as it would be now. Exit 1."""
    con = console(args)
    if args.json:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    print(f"{res.message}; nothing was changed. What changed:", file=con.err)
    for line in res.changes[:40]:
        print(f"  {line}", file=con.err)
    if len(res.changes) > 40:
        print(f"  ... and {len(res.changes) - 40} more", file=con.err)
    if res.now is not None:
        print("The plan now:", file=con.err)
        print(render_plan(res.now, res.observed, con.style(con.err)), file=con.err)
    return res.exit_code


def _shower(con: Any) -> Any:
    """What prints a saved plan once it holds, before its apply's progress (stderr) begins."""

    def shown(plan: Any, observed: Any) -> None:
        print(render_plan(plan, observed, con.style()), file=con.out)
        con.out.flush()

    return shown


def cmd_apply(args: argparse.Namespace) -> int:
    con = console(args)
    svc = service(args)
    cancel = con.cancel or threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        cancel.set()
        print(f"\n{signal.Signals(signum).name}: finishing at the next safe point", file=sys.stderr)

    progress = TerminalProgress(con.err, quiet=args.json)
    # Inside the loop the client takes the signals and says so (reconciler.control); here the process does.
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)} if con.local else {}
    try:
        if args.plan_file:
            shown = None if args.json else _shower(con)  # the plan before the progress lines, as without a file
            res = svc.apply_saved(args.plan_file, progress=progress, cancel=cancel, shown=shown)
            if res.passed is None:
                return _stale(res, args)
            result = res.passed
        else:
            with svc.apply_session(progress=progress, cancel=cancel) as session:
                if not args.json:
                    print(render_plan(session.plan, session.observed, con.style()), file=con.out)
                    con.out.flush()  # the plan comes before the progress lines (stderr), also when piped
                first = session.plan
                acts = bool(first.actions) and first.apply_refusal is None
                if acts and not args.yes:
                    if args.json or not con.stdin_tty:
                        why = "--json never prompts" if args.json else "no terminal to ask on"
                        svc.record_refusal("apply", f"not approved ({why})")
                        message = f"{why}; nothing was changed. {APPROVAL_HELP}"
                        print(f"error: {message}", file=con.err)
                        if args.json:
                            # The plan it would have run, and why it did not: stdout is never empty under --json.
                            emit_json(
                                {
                                    "host": first.host,
                                    "result": "error",
                                    "plan": first.to_json(),
                                    "error": {"code": "approval_required", "message": message},
                                },
                                con.out,
                            )
                        return EXIT_ERROR
                    # A loop's passes go on while a person decides (the host lock of a stand-alone apply stays held).
                    with svc.released():
                        answer = con.ask(f"Apply {len(first.actions)} action(s)? [y/N] ").strip().lower()
                    if answer not in ("y", "yes"):
                        print("nothing changed", file=con.err)
                        return EXIT_ERROR
                    # What runs is what was shown: a change while the prompt waited means another plan.
                    changes = session.refresh()
                    if changes:
                        message = "the host or its files changed while the plan waited for approval"
                        return _stale(
                            ApplyResult(
                                first.host,
                                changes=changes,
                                message=message,
                                now=session.plan,
                                observed=session.observed,
                            ),
                            args,
                        )
                result = session.run()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if args.json:
        emit_json(result.to_json(), con.out)
    else:
        s = con.style()
        if result.result == "converged":
            done = f"converged in {result.seconds:.1f}s ({len(result.outcomes)} action(s))"
            # What the pass kept for its logs and left to the next plan, where it did.
            print(s.green(f"{done}; {result.message}" if result.message else done), file=con.out)
        elif result.result == "blocked":
            print(s.red(f"blocked: {result.message}"), file=con.err)
        else:
            print(s.red(f"{result.result}: {result.message}"), file=con.err)
    return result.exit_code


def cmd_adopt(args: argparse.Namespace) -> int:
    """Make containers that carry this host's labels but no install id (made by an earlier version of this tool)
    this install's, by name or id. Explicit and logged: nothing is ever adopted silently."""
    con = console(args)
    res = service(args).adopt(args.containers)
    for line in res.notes:
        print(line, file=con.err)
    if args.json:
        emit_json(res.to_json(), con.out)
    else:
        for c in res.adopted:
            print(
                f"adopted {c['name']} ({c['id'][:12]}, {c['recipe'] or 'no recipe'} on "
                f"{','.join(c['slots']) or 'no slot'})",
                file=con.out,
            )
    return res.exit_code


def cmd_prune(args: argparse.Namespace) -> int:
    """The failed containers kept for their logs: shown (a dry run), removed with ``--confirm``. Exit 0 done or
    nothing to do, 1 when one could not be removed."""
    con = console(args)
    res = service(args).prune(confirm=args.confirm)
    if args.json:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    if not res.kept_failed:
        print("no failed containers kept", file=con.out)
        return res.exit_code
    for c in res.kept_failed:
        code = "" if c["exit_code"] is None else f" with code {c['exit_code']}"
        where = f"{c['recipe'] or 'no recipe'} on {','.join(c['gpus']) or 'no slot'}"
        gone = " - removed" if c["name"] in res.removed else ""
        print(f"  {c['name']} ({c['id'][:12]}, {where}, {c['state']}{code}){gone}", file=con.out)
    for f in res.failed:
        print(f"error: {f['name']}: {f['reason']}", file=con.err)
    if not res.confirmed:
        print(
            f"{len(res.kept_failed)} failed container(s) kept for their logs; dry run: "
            "`reconciler prune --confirm` removes them",
            file=con.out,
        )
    return res.exit_code


def cmd_probe(args: argparse.Namespace) -> int:
    """Run one suite of a recipe's functional probes against its running lane now, sampling its cards' free VRAM
    meanwhile. Exit 0 all passed (and the reserve held, under enforce), 1 otherwise."""
    con = console(args)
    res = service(args).probe(args.recipe, suite=args.suite)
    if args.json:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    out = con.out
    where = ", ".join(res.containers) or "no running container of it (the probes ask its URL anyway)"
    print(f"recipe {res.recipe} on host {res.host}, suite {args.suite}: {where}", file=out)
    if not res.results:
        print(f'  no probes in suite {args.suite}: add [[probes]] with suite = "{args.suite}" to the recipe', file=out)
    if not res.containers and res.results and not any(r.ok for r in res.results):
        # No lane runs and nothing answered: one line, not the same connection error once per probe.
        print(
            f"  FAIL not running: none of the {len(res.results)} probe(s) was answered ({res.results[0].detail})",
            file=out,
        )
    else:
        for r in res.results:
            print(f"  {'ok  ' if r.ok else 'FAIL'} {r.name:<16} {r.kind:<11} {r.seconds:6.2f}s  {r.detail}", file=out)
    vram = res.run.vram if res.run is not None else None
    if vram is not None and vram.checked:
        for low in vram.slots:
            print(f"  {'BELOW' if low.below_reserve else 'vram '} {low.describe()}", file=out)
        for slot in vram.unknown:
            print(f"  vram  {slot}: free VRAM not sampled", file=out)
        if vram.below and not vram.failed:
            print("  (gpu_reserve policy report: said, not failed)", file=out)
    print(f"{sum(r.ok for r in res.results)}/{len(res.results)} probe(s) passed", file=out)
    return res.exit_code


def cmd_switch(args: argparse.Namespace) -> int:
    """``reconciler switch NAME [--wait]``: the manifest's topology set to NAME; with ``--wait`` the pass runs now
    as ``apply --yes`` runs it (and exits as apply does)."""
    con = console(args)
    res = service(args).switch(args.name)
    if args.json and not args.wait:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    # with --wait --json, stdout is apply's JSON answer: the switch's own line goes to stderr
    note = con.err if args.json else con.out
    done = f"topology {res.before} -> {res.after}" if res.changed else f"topology is {res.after} already"
    print(f"{res.manifest}: {done}", file=note)
    if not args.wait:
        if res.loop_running:
            print("the loop converges it (or run `reconciler apply`)", file=note)
        elif res.changed:
            print(
                f"no loop is running for host {res.host}, so nothing converges it yet: run `reconciler apply`, "
                f"or switch with `reconciler switch {res.after} --wait` (`reconciler run` keeps the host converged)",
                file=note,
            )
        return res.exit_code
    args.plan_file, args.yes = None, True
    return cmd_apply(args)


def cmd_promote(args: argparse.Namespace) -> int:
    """``reconciler promote ALIAS RECIPE [--wait]``: the alias set to RECIPE when its evidence passes every gate of
    the alias; with ``--wait`` the pass runs now as ``apply --yes`` runs it (and exits as apply does)."""
    con = console(args)
    res = service(args).promote(args.alias, args.recipe)
    if args.json and not args.wait:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    note = con.err if args.json else con.out  # with --wait --json, stdout is apply's JSON answer
    done = (
        f"alias {res.alias}: {res.before} -> {res.after}"
        if res.changed
        else f"alias {res.alias} is {res.after} already"
    )
    print(f"{res.manifest}: {done} (evidence {res.evidence})", file=note)
    if not args.wait:
        print("the loop converges it (or run `reconciler apply`)", file=note)
        return res.exit_code
    args.plan_file, args.yes = None, True
    return cmd_apply(args)


def cmd_sync(args: argparse.Namespace) -> int:
    """``reconciler sync``: fetch the host's git source now and take its newest commit where it may be taken."""
    con = console(args)
    res = service(args).sync()
    if args.json:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    for line in render_source(res.record.to_json(), taken=res.taken, before=res.before):
        print(line, file=con.out)
    return res.exit_code
