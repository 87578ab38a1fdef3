"""Small truths of the status and probe lines (issue 44, item 8): a backoff whose wait is over is gone once its lane
serves (and never says "next try at" a time past); the last probe runs of a recipe the manifest no longer runs are
marked old; a share is rounded as people read it (99.7% is not 100%); a held lane's last error is cut at a word."""

from __future__ import annotations

import time
from typing import Any

import pytest
from planner_fixtures import make_desired, make_observed

from reconciler.base.units import percent
from reconciler.cli.render import Style, render_status
from reconciler.plan.planner import plan
from reconciler.service.status import status_data

B = "dark-compute-b"
CASE: dict[str, Any] = {
    "recipes": {"omni": {}, "old": {}},
    "manifest": [{"omni": [B]}],
    "observed": {
        "containers": [{"name": f"reconciler-omni-{B}", "managed": True, "recipe": "omni", "slots": [B]}],
    },
}


def _data() -> dict[str, Any]:
    desired = make_desired(CASE)
    observed = make_observed(CASE, desired)
    data = status_data(desired, observed, plan(desired, observed))
    assert data["plan"]["satisfied"] == [f"reconciler-omni-{B}"], data["plan"]
    return data


def _backoff(until: float) -> dict[str, Any]:
    return {"recipe": "omni", "recipe_hash": "h", "failures": 2, "until": until, "last_error": "fake failure"}


def test_a_backoff_whose_wait_is_over_is_gone_once_its_lane_serves() -> None:
    data = _data()
    data["loop"] = {"pid": 1, "passes": 3, "backoff": {f"omni@{B}": _backoff(time.time() - 30)}}
    text = render_status(data, Style(color=False))
    assert "backoff" not in text, text
    # Not serving: still said, as due now rather than at a time already past.
    data["plan"]["satisfied"] = []
    text = render_status(data, Style(color=False))
    assert f"backoff omni@{B}: 2 failed enter(s), next try due now" in text, text
    data["loop"]["backoff"] = {f"omni@{B}": _backoff(time.time() + 60)}
    assert "next try at " in render_status(data, Style(color=False))


def test_probe_runs_of_a_recipe_no_longer_wanted_are_marked_old() -> None:
    data = _data()
    run = {"passed": 1, "planned": 2, "started": time.time(), "probes": [{"name": "smoke", "ok": False, "detail": "x"}]}
    data["probe_suites"] = {"omni": {"preflight": run}, "old": {"preflight": run}}
    lines = render_status(data, Style(color=False)).splitlines()
    (omni,) = [ln for ln in lines if ln.startswith("  omni preflight")]
    (old,) = [ln for ln in lines if ln.startswith("  old preflight")]
    assert "(old: the manifest runs no lane of it now)" in old and "old:" not in omni, lines


def test_a_share_is_rounded_as_read() -> None:
    assert percent(997, 1000) == "99.7%"
    assert percent(9999, 10000) == "99.9%"  # not all: never 100% by rounding
    assert percent(1000, 1000) == "100%"
    assert percent(1, 10000) == "0.1%"
    assert percent(0, 10) == "0%"
    assert percent(1, 4) == "25%"
    assert percent(1, 0) == "?"


def test_a_held_lanes_last_error_is_cut_at_a_word(monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.service import loop_view as lv

    error = "enter failed: " + " ".join(f"word{i:03d}" for i in range(80))
    state = {"backoff": {f"omni@{B}": {**_backoff(time.time() + 60), "last_error": error}}}
    monkeypatch.setattr(lv, "read_loop_state", lambda host: state)
    view = lv.loop_view("h")
    reason = view["hold"][f"omni@{B}"]
    tail = reason.split("(last error: ", 1)[1]
    assert len(tail) < len(error) and tail.rstrip(")").endswith("…"), tail
    cut = tail.rstrip(")").rstrip("…").rstrip()
    assert cut.split()[-1].startswith("word") and len(cut.split()[-1]) == 7, cut
