"""The handlers of the read-only commands ``reconciler plan``, ``status`` and ``audit`` (registered by
``reconciler.cli``), on the service layer, in JSON or as text (``reconciler.cli.render``). Loaded when one of them
runs; a running loop answers them for its clients (``reconciler.cli.front_ends``).
"""

from __future__ import annotations

import argparse

from reconciler.base.errors import ReconcilerError
from reconciler.base.terminal import emit_json
from reconciler.cli.commands.host import service
from reconciler.cli.common import EXIT_ERROR, console
from reconciler.cli.render import render_aliases, render_audit, render_plan, render_status
from reconciler.service import parse_since


def cmd_plan(args: argparse.Namespace) -> int:
    con = console(args)
    res = service(args).plan(out=args.out)
    if args.out:
        print(f"plan saved to {args.out}; apply exactly it with `reconciler apply {args.out}`", file=con.err)
    if args.json:
        emit_json(res.to_json(), con.out)
    else:
        print(render_plan(res.plan, res.observed, con.style()), file=con.out)
        if res.aliases:
            print("\n".join(render_aliases(res.aliases, con.style())), file=con.out)
    if res.exit_code == EXIT_ERROR:
        for s in res.observed.unavailable():
            print(f"error: {s.name} source unavailable: {s.detail}", file=con.err)
    return res.exit_code


def cmd_status(args: argparse.Namespace) -> int:
    con = console(args)
    res = service(args).status()
    if args.json:
        emit_json(res.to_json(), con.out)
    else:
        print(render_status(res.data, con.style()), file=con.out)
    for s in res.observed.unavailable():
        print(f"error: {s.name} source unavailable: {s.detail}", file=con.err)
    return res.check_code if args.check else res.exit_code


def cmd_audit(args: argparse.Namespace) -> int:
    con = console(args)
    res = service(args).audit(since=_since(args.since))
    if args.json:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    if res.records:
        print(render_audit(res.records), file=con.out)
    else:
        print("no audit records" + (f" since {args.since}" if args.since else ""), file=con.err)
    return res.exit_code


def _since(text: str | None) -> float | None:
    """``--since``, parsed by the service layer like the API's ``since``."""
    try:
        return parse_since(text)
    except ValueError as exc:
        raise ReconcilerError(f"--since {text!r}: {exc}") from None
