"""The handlers of ``reconciler qualify RECIPE`` and ``reconciler evidence [RECIPE]`` (registered by
``reconciler.cli.qualify``), on the service layer (``HostService.qualify``, ``HostService.evidence``). Loaded when one
of them runs.
"""

from __future__ import annotations

import argparse

from reconciler.base.jsonstrict import loads
from reconciler.base.terminal import emit_json
from reconciler.cli.commands.host import service
from reconciler.cli.common import EXIT_ERROR, EXIT_OK, console
from reconciler.service.evidence import LADDER_HEAD, ladder_rows, render_report
from reconciler.service.qualify import parse_ladder


def cmd_qualify(args: argparse.Namespace) -> int:
    """Exit 0 every run passed, 1 a run failed (its record kept) or the qualification was refused."""
    con = console(args)
    res = service(args).qualify(args.recipe, ladder=parse_ladder(args.ladder), reload=args.reload, repeat=args.repeat)
    if args.json:
        emit_json(res.to_json(), con.out)
        return int(res.exit_code)
    rec = res.record
    print(f"recipe {rec['recipe']} ({rec['recipe_hash']}) on host {rec['host']}: {rec['status']}", file=con.out)
    for i, run in enumerate(rec["runs"], 1):
        print(f"run {i}: {run['status']}" + (f" ({run['why']})" if run["why"] else ""), file=con.out)
        print("  " + " | ".join(LADDER_HEAD), file=con.out)
        for row in ladder_rows(run):
            print("  " + " | ".join(row), file=con.out)
        rel = run.get("reload")
        if rel:
            ext, moved = rel.get("external_hits_tokens") or {}, rel.get("cpu_to_gpu_bytes") or {}
            print(
                f"  reload {'proven' if rel['proven'] else 'not proven'}: external hits {ext.get('before')} -> "
                f"{ext.get('after')}, CPU-to-GPU bytes {moved.get('before')} -> {moved.get('after')}",
                file=con.out,
            )
        for slot, low in sorted((run.get("vram") or {}).items()):
            print(
                f"  vram {slot}: {low['min_free_bytes']} bytes free at its lowest, during {low['during']}", file=con.out
            )
    for c in rec["caveats"]:
        print(f"caveat: {c}", file=con.out)
    print(f"evidence kept: {res.path}", file=con.out)
    return int(res.exit_code)


def cmd_evidence(args: argparse.Namespace) -> int:
    """Exit 0; 1 for --report without a recipe or without a record of it."""
    con = console(args)
    res = service(args).evidence(args.recipe)
    if args.report:
        readable = [r for r in res.records if not r.get("unreadable")]
        if not args.recipe or not readable:
            print(f"error: --report needs a recipe with kept evidence ({args.recipe or 'none named'})", file=con.err)
            return EXIT_ERROR
        try:
            gates = loads(args.gates) if args.gates else None
        except ValueError as exc:
            print(f"error: --gates: {exc}; write JSON, e.g. '{{\"reserve_free_gib\": 3}}'", file=con.err)
            return EXIT_ERROR
        if gates is not None and not isinstance(gates, dict):
            print("error: --gates is a JSON object of gates, e.g. '{\"reserve_free_gib\": 3}'", file=con.err)
            return EXIT_ERROR
        newest = max(readable, key=lambda r: float(r.get("started") or 0))
        print(
            render_report(newest, current_hash=res.current_hashes.get(args.recipe), gates=gates), end="", file=con.out
        )
        return EXIT_OK
    if args.json:
        emit_json(res.to_json(), con.out)
        return EXIT_OK
    if not res.records:
        print("no evidence kept: `reconciler qualify RECIPE` keeps one", file=con.out)
    for r in res.to_json()["records"]:
        if r.get("unreadable"):
            print(f"{r['recipe']}: {r['file']}: unreadable ({r['unreadable']})", file=con.out)
            continue
        mark = "current" if r["current"] else "earlier hash"
        print(
            f"{r['recipe']} {r['recipe_hash']} ({mark}) {r['date']} {r['status']}, {len(r['runs'])} run(s): {r['file']}",
            file=con.out,
        )
    return EXIT_OK
