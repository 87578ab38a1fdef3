"""``reconciler promote ALIAS RECIPE`` (reconciler/service/promote.py over load/alias_edit.py), through the command
line, the HTTP API of a running loop (real HTTP) and MCP (the SDK's own client over stdio): the alias's recipe is
moved only when the kept evidence for the recipe's current hash passes every gate of the alias, every other byte of
the manifest kept; refused otherwise, naming each failed gate with its figure, and for evidence of an earlier hash;
both audited with the caller (and the evidence it rested on)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import LoopProcess, Root
from unit.test_qualify_evidence import record

from real.test_api import TOKEN, Api, token_file
from real.test_mcp import on_stdio, structured
from reconciler.load.desired import load_desired
from reconciler.store.evidence import keep

GATES = "{reserve_free_gib: 3, reload: proven}"
RESERVE = "reserve_free_gib: dark-compute-a had 1.25 GiB free at its lowest, during the 250000 rung; the gate is 3"


def manifest_text(root: Root, omni: str, lane: str) -> str:
    return f"""\
# the champion serves chat; a challenger waits for its evidence
host: {root.host}
topology: split
aliases:
  chat: {{recipe: {omni}, gates: {GATES}}}   # promoted by hand, 2026-08-01
topologies:
  split:
    - recipe: {omni}
      gpus: [dark-compute-b]
  exclusive:
    - recipe: {lane}
      gpus: [dark-compute-a, dark-compute-b]
"""


@pytest.fixture
def promotable(root: Root) -> Iterator[tuple[str, str]]:
    omni, lane = root.recipe("omni"), root.recipe("deepseek-256k-offload", offload_mib=16)
    root.write_manifest_text(manifest_text(root, omni, lane))
    yield omni, lane


def evidence(root: Root, recipe: str, *, reserve_gib: float = 1.25, recipe_hash: str | None = None) -> None:
    """A kept record of ``recipe`` (the report's figures), of its current hash unless ``recipe_hash`` says."""
    before = os.environ.get("RECONCILER_STATE_DIR")
    os.environ["RECONCILER_STATE_DIR"] = root.env["RECONCILER_STATE_DIR"]
    try:
        current = load_desired(root.path).recipes[recipe].content_hash()
        rec = record(recipe=recipe, recipe_hash=recipe_hash or current, host=root.host)
        rec["runs"][0]["vram"]["dark-compute-a"]["min_free_bytes"] = int(reserve_gib * (1 << 30))
        rec["started"] = time.time()
        keep(root.host, rec)
    finally:
        if before is None:
            del os.environ["RECONCILER_STATE_DIR"]
        else:
            os.environ["RECONCILER_STATE_DIR"] = before


def audited(root: Root) -> list[dict[str, Any]]:
    res = root.cli("audit", "--json")
    assert res.rc == 0, str(res)
    return [r for r in res.data["records"] if r.get("action") == "promote"]


def test_promote_on_the_command_line(root: Root, promotable: tuple[str, str]) -> None:
    omni, lane = promotable
    text = root.manifest_path.read_text()
    none = root.cli("promote", "chat", lane, "--json")
    assert none.rc == 1 and none.data["error"]["code"] == "promote_refused", str(none)
    assert "no evidence for recipe hash" in none.stderr and "Traceback" not in none.stderr

    evidence(root, lane, recipe_hash="0123456789abcdef")  # an earlier hash's passing evidence never counts
    old = root.cli("promote", "chat", lane)
    assert old.rc == 1 and "evidence of 0123456789abcdef does not count" in old.stderr, str(old)

    evidence(root, lane)  # this hash, 1.25 GiB free at its lowest on dark-compute-a
    short = root.cli("promote", "chat", lane)
    assert short.rc == 1 and "challenger, no promotion: " + RESERVE in short.stderr, str(short)
    assert root.manifest_path.read_text() == text, "a refusal changes nothing"

    evidence(root, lane, reserve_gib=3.5)  # the newest record of this hash passes every gate
    done = root.cli("promote", "chat", lane, "--json")
    assert done.rc == 0, str(done)
    assert done.data["from"] == omni and done.data["recipe"] == lane and done.data["changed"] is True
    assert done.data["gates"] == {"reserve_free_gib": 3, "reload": "proven"} and done.data["evidence"]
    assert root.manifest_path.read_text() == text.replace(f"{{recipe: {omni},", f"{{recipe: {lane},", 1)
    assert load_desired(root.path).aliases["chat"].recipe == lane

    recs = audited(root)
    assert [r["outcome"] for r in recs] == ["refused", "refused", "refused", "ok"], recs
    assert RESERVE in recs[2]["reason"] and recs[2]["front"] == "cli"
    assert recs[3]["evidence"] == done.data["evidence"] and recs[3]["recipe_hash"] == done.data["recipe_hash"]

    unknown = root.cli("promote", "nope", lane)
    assert unknown.rc == 1 and "'nope' is no alias of the manifest: its aliases: chat" in unknown.stderr


def test_promote_through_the_http_api(root: Root, promotable: tuple[str, str], tmp_path: Path) -> None:
    omni, lane = promotable
    text = root.manifest_path.read_text()
    evidence(root, lane)
    lp = LoopProcess(root, "--api-token-file", str(token_file(tmp_path))).started()
    try:
        api = Api(f"http://{lp.addr}", TOKEN)
        status, _, body = api.post("/v1/promote", {"alias": "chat", "recipe": lane})
        assert status == 409 and RESERVE in json.dumps(body), body
        assert root.manifest_path.read_text() == text
        status, _, body = api.post("/v1/promote", {"alias": "chat", "recipe": "Bad Name"})
        assert status == 400, body
        evidence(root, lane, reserve_gib=4)
        status, _, body = api.post("/v1/promote", {"alias": "chat", "recipe": lane})
        assert status == 200 and body["from"] == omni and body["recipe"] == lane, body
    finally:
        lp.stop()
    recs = audited(root)
    assert [(r["outcome"], r["front"]) for r in recs][-2:] == [("refused", "api"), ("ok", "api")], recs


def test_promote_through_mcp(root: Root, promotable: tuple[str, str]) -> None:
    omni, lane = promotable
    evidence(root, lane)

    async def check(session: Any) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert "promote" in tools["host_manage"].input_schema["properties"]["action"]["enum"]
        r = await session.call_tool("host_manage", {"action": "promote", "alias": "chat"})
        assert r.is_error and "needs alias and recipe" in r.content[0].text, r
        r = await session.call_tool("host_manage", {"action": "promote", "alias": "chat", "recipe": lane})
        assert r.is_error and RESERVE in r.content[0].text, r
        evidence(root, lane, reserve_gib=4)
        done = structured(
            await session.call_tool("host_manage", {"action": "promote", "alias": "chat", "recipe": lane})
        )
        assert done["from"] == omni and done["recipe"] == lane and done["changed"], done

    anyio.run(on_stdio, root, check, backend="asyncio")
    assert load_desired(root.path).aliases["chat"].recipe == lane
    recs = [r for r in audited(root) if r["front"] == "mcp"]
    assert [r["outcome"] for r in recs] == ["refused", "ok"], recs


def test_plan_status_and_the_page_show_each_alias_and_its_verdict(root: Root, promotable: tuple[str, str]) -> None:
    from reconciler.api.page.sections import plan_section

    omni, lane = promotable

    def verdicts(*args: str) -> dict[str, tuple[str, str]]:
        res = root.cli(*args, "--json")
        assert res.rc in (0, 2), str(res)
        return {a["alias"]: (a["recipe"], a["verdict"]) for a in res.data["aliases"]}

    assert verdicts("plan") == verdicts("status") == {"chat": (omni, "not qualified")}
    evidence(root, omni, recipe_hash="0123456789abcdef")  # of an earlier hash: still not qualified
    assert verdicts("status") == {"chat": (omni, "not qualified")}
    evidence(root, omni)
    challenger = {"chat": (omni, "challenger, no promotion: reserve_free_gib")}
    assert verdicts("plan") == verdicts("status") == challenger
    text = root.cli("status")
    assert f"chat -> {omni}: challenger, no promotion: reserve_free_gib" in text.stdout, str(text)
    status = root.cli("status", "--json").data
    page = str(plan_section(status["plan"], status["aliases"]))
    assert "Aliases" in page and "challenger, no promotion: reserve_free_gib" in page and RESERVE in page, page
    evidence(root, lane, reserve_gib=4)
    assert root.cli("promote", "chat", lane).rc == 0
    assert verdicts("plan") == verdicts("status") == {"chat": (lane, "promoted")}
    text = root.cli("plan")
    assert f"chat -> {lane}: promoted" in text.stdout, str(text)


def test_promote_wait_runs_the_pass_now(root: Root, promotable: tuple[str, str]) -> None:
    omni, lane = promotable
    evidence(root, lane, reserve_gib=4)
    done = root.cli("promote", "chat", lane, "--wait", "--json", timeout=120)
    assert done.rc == 0 and done.data["result"] == "converged", str(done)  # stdout: apply's answer
    assert f"alias chat: {omni} -> {lane}" in done.stderr, str(done)
    assert root.cname(omni, "dark-compute-b") in root.running()
    assert load_desired(root.path).aliases["chat"].recipe == lane
