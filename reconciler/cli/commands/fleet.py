"""The handler of ``reconciler fleet status`` (registered by ``reconciler.cli.fleet``): every host of a fleet file
side by side, each read through its own loop's API (``reconciler.service.fleet``), as a table. Loaded when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.base.terminal import emit_json
from reconciler.base.units import human_bytes
from reconciler.cli.common import console
from reconciler.load.fleet import load_fleet
from reconciler.service.fleet import fleet_status


def cmd_fleet_status(args: argparse.Namespace) -> int:
    con = console(args)
    fleet = load_fleet(args.fleet)
    if args.timeout is not None and not 0 < args.timeout <= 300:
        raise SystemExit("reconciler fleet status: --timeout takes seconds, more than 0 and at most 300")
    res = fleet_status(fleet, timeout_s=args.timeout)
    if args.json:
        emit_json(res.to_json(), con.out)
        return res.exit_code
    for line in render_fleet(res.to_json()["hosts"]):
        print(line, file=con.out)
    return res.exit_code


def render_fleet(hosts: list[dict[str, Any]]) -> list[str]:
    """The fleet as a table: a row per slot of each host, an unreachable host on one row with why."""
    rows = [("HOST", "VERDICT", "COMMIT", "TOPOLOGY", "SLOT", "WANT", "HAS", "FREE VRAM", "TMPFS")]
    notes: list[str] = []
    for h in hosts:
        if not h["reachable"]:
            rows.append((h["name"], h.get("verdict") or "unreachable", "-", "-", "-", "-", "-", "-", "-"))
            notes.append(f"{h['name']}: {h['error']}")
            continue
        t = h.get("tmpfs") or {}
        tmpfs = f"{human_bytes(t['free_bytes'])} free of {human_bytes(t['size_bytes'])}" if t else "?"
        first = True
        for s in h["slots"] or [{"slot": "-", "desired": None, "holders": []}]:
            has = "; ".join(_holder(c) for c in s.get("holders") or ()) or ("free" if s.get("free") else "?")
            rows.append(
                (
                    h["name"] if first else "",
                    h["verdict"] if first else "",
                    (h.get("commit") or "-")[:12] if first else "",
                    (h.get("topology") or "-") if first else "",
                    s["slot"],
                    s.get("desired") or "free",
                    has,
                    _vram(s),
                    tmpfs if first else "",
                )
            )
            first = False
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out + notes


def _holder(c: dict[str, Any]) -> str:
    sleeping = c.get("sleeping")
    state = " (asleep)" if sleeping is True else " (awake)" if sleeping is False else ""
    who = c.get("recipe") or c.get("name") or "?"
    return f"{who}{state}" if c.get("owner") == "ours" else f"{c.get('name')} ({c.get('owner')})"


def _vram(s: dict[str, Any]) -> str:
    free, reserve = s.get("memory_free_bytes"), s.get("reserve_bytes")
    if free is None:
        return "n/a"
    text = f"{human_bytes(free)} (reserve {human_bytes(reserve or 0)})"
    return text + (" BELOW" if s.get("below_reserve") else "")
