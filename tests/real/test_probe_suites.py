"""Probe suites against the real engine: fake vLLM containers made from the demo's recipes, which carry the report's
preflight (run by every enter) and its regression suite (run on demand).

A preflight probe that fails fails the enter under the loop: the container is kept stopped for its logs, its GPU
is free, the recipe backs off, and the audit trail names the probe and quotes what came back. The regression suite
runs on demand from the command line, ``GET /v1/probe`` and the MCP tool ``host_probe``, each run in the audit
trail, in ``status`` and in the metrics.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import anyio
import pytest
from e2e_helpers import LoopProcess, Root

from real.test_api import TOKEN, Api, token_file
from real.test_mcp import audit_records, on_http, structured

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"


def switch(root: Root, recipe: str, mode: str) -> None:
    """Change the running fake's switches (POST /fake/mode): the lane keeps running, its answers go wrong."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{root.port_of(recipe)}/fake/mode", method="POST", data=json.dumps({"mode": mode}).encode()
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def test_a_failed_preflight_fails_the_enter_keeps_the_container_frees_the_gpu_and_backs_off(
    root: Root, tmp_path: Any
) -> None:
    omni = root.recipe("omni", mode="wrong-tool")
    root.manifest((omni, [B]))
    lp = LoopProcess(root, "--api-token-file", str(token_file(tmp_path)))
    try:
        [action] = lp.wait("action", kind="enter", result="failed", timeout=60)
        detail = action["detail"]
        assert "probe 'tools' (tools) failed: the answer calls 'other_function({})', not get_weather" in detail, detail
        assert "Kept as reconciler-" in detail, detail
        lp.wait("backoff", timeout=10)
        samples = lp.samples()
        assert samples[("reconciler_recipe_backoff", frozenset({("recipe", omni)}))] == 1.0
        assert (
            samples[
                (
                    "reconciler_probe_success",
                    frozenset({("recipe", omni), ("suite", "preflight"), ("probe", "tools"), ("kind", "tools")}),
                )
            ]
            == 0.0
        )
        assert (
            samples[
                (
                    "reconciler_probe_success",
                    frozenset(
                        {("recipe", omni), ("suite", "preflight"), ("probe", "retrieval-8k"), ("kind", "needle")}
                    ),
                )
            ]
            == 1.0
        )
    finally:
        lp.stop()
    kept = [c for c in root.containers() if "-failed-" in c["Names"][0]]
    assert len(kept) >= 1 and all(c["State"] == "exited" for c in kept), kept
    assert root.running() == {} and root.status()["slots"][B]["free"] is True
    [rec] = [r for r in audit_records(root) if r["action"] == "enter"][:1]
    assert rec["outcome"] == "failed" and "probe 'tools' (tools) failed" in rec["detail"], rec
    # The probes that ran before it, passed, and the one that failed, in order; the VRAM figures (none here).
    assert [(p["name"], p["ok"]) for p in rec["probes"]][-2:] == [("retrieval-8k", True), ("tools", False)], rec
    assert rec["vram_under_load"]["checked"] is False, rec


def test_the_regression_suite_runs_on_demand_from_the_cli_the_api_and_mcp(root: Root, tmp_path: Any) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    assert root.apply().rc == 0

    r = root.cli("probe", omni, "--suite", "regression", "--json")
    assert r.rc == 0, r
    assert r.data["suite"] == "regression" and r.data["ok"] is True and r.data["containers"] == [root.cname(omni, B)]
    by = {p["name"]: p for p in r.data["probes"]}
    assert list(by) == ["regression-json", "needle-128k", "tool-batch-20"], by
    assert by["needle-128k"]["figures"]["haystack_tokens"] == 128000, by
    batch = by["tool-batch-20"]["figures"]
    assert batch["passed"] == batch["requests"] == 20 and batch["prefix_cache"]["hits_tokens"] > 0, batch
    human = root.cli("probe", omni, "--suite", "regression")
    assert human.rc == 0 and "suite regression" in human.stdout and "3/3 probe(s) passed" in human.stdout, human
    assert "20/20 passed, p50" in human.stdout, human

    # One request of the twenty fails: the suite fails, naming the probe, the request and what came back.
    switch(root, omni, "fail-request='ORD-7'")
    r = root.cli("probe", omni, "--suite", "regression", "--json")
    assert r.rc == 1 and r.data["ok"] is False, r
    [bad] = [p for p in r.data["probes"] if not p["ok"]]
    assert bad["name"] == "tool-batch-20" and "19/20 passed" in bad["detail"], bad
    assert "request 7 failed: HTTP 500" in bad["detail"], bad
    switch(root, omni, "")

    lp = LoopProcess(root, "--api-token-file", str(token_file(tmp_path))).started()
    try:
        api = Api(f"http://{lp.addr}", TOKEN)
        status, headers, body = api.get(f"/v1/probe?recipe={omni}&suite=regression", timeout=120)
        assert status == 200 and headers["x-reconciler-exit-code"] == "0", (status, body)
        assert body["suite"] == "regression" and body["passed"] == 3, body
        for query, says in (
            (f"?recipe={omni}&suite=nightly", "suite"),
            ("?suite=regression", "recipe"),
            ("?recipe=../etc&suite=regression", "recipe"),
        ):
            status, _, body = api.get(f"/v1/probe{query}")
            assert status == 400 and says in json.dumps(body), (query, status, body)
        status, _, _ = api.get(f"/v1/probe?recipe={omni}", token=None)
        assert status == 401

        async def check(session: Any) -> None:
            res = await session.call_tool("host_probe", {"recipe": omni, "suite": "regression"})
            data = structured(res)
            assert not res.is_error and data["ok"] is True and data["passed"] == 3, data

        anyio.run(on_http, f"{api.base}/mcp", TOKEN, check, backend="asyncio")
        samples = lp.samples()
        assert (
            samples[
                (
                    "reconciler_probe_success",
                    frozenset(
                        {("recipe", omni), ("suite", "regression"), ("probe", "tool-batch-20"), ("kind", "batch")}
                    ),
                )
            ]
            == 1.0
        )
        assert (
            samples[("reconciler_probe_suite_success", frozenset({("recipe", omni), ("suite", "regression")}))] == 1.0
        )
    finally:
        lp.stop()

    probes = [(r["front"], r["outcome"]) for r in audit_records(root) if r["action"] == "probe"]
    assert probes == [("cli", "ok"), ("cli", "ok"), ("cli", "failed"), ("api", "ok"), ("mcp", "ok")], probes
    st = root.cli("status", "--json")
    last = st.data["probe_suites"][omni]
    assert last["regression"]["ok"] is True and last["preflight"]["ok"] is True, last
    human = root.cli("status")
    assert "probe suites" in human.stdout and f"{omni} regression: 3/3 passed" in human.stdout, human.stdout
