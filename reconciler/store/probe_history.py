"""The last run of each recipe's probe suites, kept under the host's state directory as ``probes.json`` (``state.read_record`` and ``write_record``): each probe's result
and duration, and the lane's free VRAM at its lowest while the suite ran.

Written after every suite run: by the apply layer (an enter's preflight) and by the service layer (``reconciler
probe``, ``GET /v1/probe``, the MCP tool ``host_probe``). Read by ``status`` and by the metrics at each scrape, so a
suite run from any front-end shows in both. A damaged file reads as empty: it is a report, never a reason to fail.
"""

from __future__ import annotations

from typing import Any

from reconciler.store.state import StateError, read_record, write_record

FILE = "probes.json"


def record_suite(host: str, run: dict[str, Any]) -> None:
    """Keep ``run`` (``SuiteRun.to_json()``) as the last run of its recipe's suite."""
    try:
        data = read_record(host, FILE)
        runs = data.setdefault(str(run["recipe"]), {})
        if not isinstance(runs, dict):
            runs = data[str(run["recipe"])] = {}
        runs[str(run["suite"])] = run
        write_record(host, FILE, data)
    except StateError:
        return


def last_suites(host: str, recipes: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{recipe: {suite: run}}``; with ``recipes``, only those (a recipe removed since is not shown)."""
    try:
        data = read_record(host, FILE)
    except StateError:
        return {}
    return {
        r: {s: run for s, run in suites.items() if isinstance(run, dict)}
        for r, suites in sorted(data.items())
        if isinstance(suites, dict) and (recipes is None or r in recipes)
    }
