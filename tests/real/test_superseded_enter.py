"""An edit supersedes a stale enter, for real: the loop (``reconciler run``) enters a lane whose recipe can never
become healthy (its health URL asks a path the server does not answer) with a long ``start_timeout_s``; the recipe
is fixed a second later. The enter is abandoned at its next health poll (kept stopped for its logs, audited, no
backoff) and the fixed lane serves well within the timeout; an unrelated edit abandons nothing (docs/design.md,
"The loop").
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import pytest
from e2e_helpers import LoopProcess, Root, http_get

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"
START_TIMEOUT_S = 120.0


def test_a_fixed_recipe_supersedes_its_enter_waiting_for_health(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni", start_timeout_s=START_TIMEOUT_S)
    good = root.recipe_data(omni)
    wrong = copy.deepcopy(good)
    wrong["health"]["url"] = good["health"]["url"] + "-not-served"  # valid, same port: never answered 200
    root.write_recipe(omni, wrong)
    other = root.recipe("deepseek-256k-offload", offload_mib=16)  # nothing runs it: its edit is unrelated
    lp = start_loop().started()

    mark = lp.mark()
    root.manifest((omni, [B]))
    lp.wait("phase", after=mark, kind="enter", phase="loading", timeout=30)
    # An unrelated edit while it waits: the enter goes on.
    time.sleep(0.5)
    data = root.recipe_data(other)
    data["stop"]["timeout_s"] = 7  # its hash changes; the lane being entered is the same
    root.write_recipe(other, data)
    time.sleep(1.5)  # several health polls after that edit
    assert not lp.find("action", after=mark, kind="enter"), "an unrelated edit abandoned nothing: " + lp.log()

    fixed_at = time.monotonic()
    root.write_recipe(omni, good)
    (abandoned,) = lp.wait("action", after=mark, kind="enter", result=lambda r: r != "ok", timeout=20)
    assert abandoned["result"] == "superseded", lp.log()
    assert "superseded while waiting for its health" in abandoned["detail"], abandoned.data
    assert f"recipe {omni} was edited" in abandoned["detail"], abandoned.data
    lp.wait("action", after=mark, kind="enter", result="ok", timeout=40)
    took = time.monotonic() - fixed_at
    assert took < START_TIMEOUT_S / 3, f"the fixed lane served {took:.1f} s after the fix"
    assert http_get(f"http://127.0.0.1:{root.port_of(omni)}/health")[0] == 200

    # The superseded container is kept, stopped, for its logs; the lane that serves is a new container.
    kept = [c for c in root.containers() if "-failed-" in c["Names"][0]]
    assert len(kept) == 1 and kept[0]["State"] != "running", root.containers()
    assert kept[0]["Names"][0].lstrip("/") in abandoned["detail"], abandoned.data
    assert set(root.running()) == {root.cname(omni, B)}
    # No backoff for it: it did not fail, it was no longer wanted.
    assert not lp.find("backoff", after=mark), lp.log()
    assert lp.metric("reconciler_actions_total", kind="enter", result="superseded") == 1

    # Audited as what it was.
    audit = root.cli("audit", "--json").data["records"]
    sup = [r for r in audit if r.get("action") == "enter" and r.get("outcome") == "superseded"]
    assert len(sup) == 1 and sup[0]["front"] == "loop", audit
    assert "superseded while waiting for its health" in sup[0]["detail"], sup[0]
