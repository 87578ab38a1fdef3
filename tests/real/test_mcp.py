"""The MCP server for real: the SDK's own client session (``mcp.ClientSession``) against ``reconciler mcp`` over
stdio, and against a running ``reconciler run`` over streamable HTTP at ``/mcp`` behind its bearer token.

Both transports: the four tools are listed with their schemas and annotations; ``host_shared_memory`` on a real
tmpfs with a real process mapping one offload file and two orphans is exactly ``shm status --json``;
``host_manage reclaim-shared-memory`` as a dry run removes nothing, confirmed it removes exactly the orphans; each
confirmed call is in the audit trail as the MCP caller. Over HTTP: no token is 401, ``host_plan`` gives a plan id
that ``host_manage apply`` carries out or refuses as stale; over stdio while a loop holds the host, a confirmed
reclaim is refused (the host lock), and its dry run still answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from e2e_helpers import LoopProcess, Root

from real.test_api import TOKEN, Api, quiet_loop, shm_files  # noqa: F401 - fixtures

pytestmark = [pytest.mark.docker, pytest.mark.root]

TOOLS = {"host_status", "host_plan", "host_shared_memory", "host_probe", "host_manage"}


def stdio_params(root: Root) -> Any:
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "reconciler", "--root", str(root.path), "mcp"],
        env={k: v for k, v in root.env.items() if k.startswith(("RECONCILER_", "NO_COLOR"))},
    )


async def on_stdio(root: Root, check: Any) -> Any:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import stdio_client

    async with stdio_client(stdio_params(root)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await check(session)


async def on_http(url: str, token: str, check: Any) -> Any:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await check(session)


def structured(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None, result
    assert json.loads(result.content[0].text) == result.structured_content, "the text is the same JSON"
    return result.structured_content


async def check_tools(session: Any) -> None:
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == TOOLS, tools
    for name in TOOLS - {"host_manage", "host_probe"}:
        a = tools[name].annotations
        assert a.read_only_hint is True and a.destructive_hint is False and a.idempotent_hint is True, (name, a)
        assert tools[name].input_schema["type"] == "object" and tools[name].output_schema["type"] == "object"
    manage = tools["host_manage"]
    assert manage.annotations.read_only_hint is False and manage.annotations.destructive_hint is True
    assert manage.annotations.idempotent_hint is False
    props = manage.input_schema["properties"]
    assert manage.input_schema["required"] == ["action"], manage.input_schema
    assert props["action"]["enum"] == ["reclaim-shared-memory", "apply", "switch", "promote", "sync"]
    assert props["confirm"]["type"] == "boolean" and props["confirm"]["default"] is False
    assert props["plan_id"]["default"] is None
    assert {"pattern": "^[0-9a-f]{32}$", "type": "string"} in props["plan_id"]["anyOf"], props["plan_id"]
    assert tools["host_plan"].input_schema["properties"]["save"]["default"] is True
    # A probe changes nothing on the host, but each call loads the lane again: read-only, not idempotent.
    probe = tools["host_probe"]
    assert probe.annotations.read_only_hint is True and probe.annotations.destructive_hint is False
    assert probe.annotations.idempotent_hint is False
    assert probe.input_schema["required"] == ["recipe"], probe.input_schema
    assert probe.input_schema["properties"]["suite"]["enum"] == ["preflight", "regression", "all"]


async def check_shm_and_reclaim(session: Any, root: Root, files: dict[str, Any]) -> None:
    mapped, orphans = files["mapped"], files["orphans"]
    shm = structured(await session.call_tool("host_shared_memory", {}))
    assert shm == await anyio.to_thread.run_sync(root.shm_status), "host_shared_memory is `shm status --json`"
    states = {Path(f["path"]).name: f["state"] for f in shm["files"]}
    assert states == {
        "vllm_offload_live.mmap": "owned",
        "vllm_offload_dead1.mmap": "orphan",
        "vllm_offload_dead2.mmap": "orphan",
    }, states
    [live] = [f for f in shm["files"] if f["path"] == str(mapped)]
    assert files["holder"].proc.pid in [o["pid"] for o in live["owners"]], live

    r = await session.call_tool("host_manage", {"action": "reclaim-shared-memory"})
    dry = structured(r)
    assert r.is_error is False and dry["confirmed"] is False, dry
    assert sorted(f["path"] for f in dry["would_reclaim"]) == sorted(map(str, orphans)), dry
    assert mapped.exists() and all(p.exists() for p in orphans), "a dry run removes nothing"

    r = await session.call_tool("host_manage", {"action": "reclaim-shared-memory", "confirm": True})
    done = structured(r)
    assert r.is_error is False and done["confirmed"] and done["verified"], done
    assert sorted(f["path"] for f in done["reclaimed"]) == sorted(map(str, orphans)), done
    assert mapped.exists() and not any(p.exists() for p in orphans), "exactly the orphans went"

    # Wrong arguments are the tool's errors, and change nothing.
    r = await session.call_tool("host_manage", {"action": "apply"})
    assert r.is_error and "plan_id" in r.content[0].text, r
    r = await session.call_tool("host_manage", {"action": "apply", "plan_id": "../../etc/passwd"})
    assert r.is_error, r
    r = await session.call_tool("host_manage", {"action": "delete-everything"})
    assert r.is_error, r


async def plan_and_apply(session: Any, root: Root, tries: int = 10) -> tuple[dict[str, Any], Any]:
    """host_plan, then host_manage apply of its plan id. A plan's fingerprint covers every container on the engine,
    so one started or stopped by anything else in between (another test on a shared engine) makes it stale: then
    plan again, a few times; stale every time is accepted only when each change is another host's container."""
    for _ in range(tries):
        plan = structured(await session.call_tool("host_plan", {}))
        r = await session.call_tool("host_manage", {"action": "apply", "plan_id": plan["plan_id"]})
        if structured(r).get("result") != "stale":
            return plan, r
        changes = structured(r)["changes"]
        assert r.is_error and changes and not any(root.tag in c for c in changes), changes
    return plan, None


def audit_records(root: Root) -> list[dict[str, Any]]:
    r = root.cli("audit", "--json")
    assert r.rc == 0, r
    return r.data["records"]


def test_stdio(root: Root, shm_files: dict[str, Any]) -> None:  # noqa: F811 - the fixture
    root.manifest()

    async def check(session: Any) -> None:
        await check_tools(session)
        await check_shm_and_reclaim(session, root, shm_files)
        st = structured(await session.call_tool("host_status", {}))
        assert set(st) == set(root.status()), st
        plan, r = await plan_and_apply(session, root)
        assert plan["changes"] is False and len(plan["plan_id"]) == 32, plan
        assert r is None or (r.is_error is False and structured(r)["result"] == "converged"), r

    anyio.run(on_stdio, root, check, backend="asyncio")
    recs = [r for r in audit_records(root) if r["front"] == "mcp"]
    # The three calls refused for their arguments are in the trail, with why.
    refused = [r for r in recs if r["action"] == "host_manage"]
    assert [r["outcome"] for r in refused] == ["refused"] * 3 and "plan_id" in refused[0]["reason"], refused
    recs = [r for r in recs if r["action"] != "host_manage"]
    assert [(r["who"], r["action"], r["outcome"]) for r in recs if r["outcome"] != "stale"][:1] == [
        ("stdio", "shm-reclaim", "ok")
    ], recs
    assert [r["outcome"] for r in recs[1:]] in (["stale"] * 10, [*["stale"] * (len(recs) - 2), "converged"]), recs
    assert recs[0]["bytes_freed"] == 5 << 20


def test_streamable_http_on_the_running_loop(
    quiet_loop: tuple[LoopProcess, Api],  # noqa: F811 - the fixture imported above
    root: Root,
    shm_files: dict[str, Any],  # noqa: F811 - the fixture imported above
) -> None:
    lp, api = quiet_loop
    url = f"{api.base}/mcp"
    for token in (None, "wrong-" + TOKEN):
        status, _, body = api.post(
            "/mcp",
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            token=token,
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert status == 401, (token, status, body)

    async def stdio_while_the_loop_runs(session: Any) -> None:
        r = await session.call_tool("host_manage", {"action": "reclaim-shared-memory", "confirm": True})
        assert r.is_error and "another reconciler holds" in r.content[0].text, r
        dry = structured(await session.call_tool("host_manage", {"action": "reclaim-shared-memory"}))
        assert len(dry["would_reclaim"]) == 2, dry

    anyio.run(on_stdio, root, stdio_while_the_loop_runs, backend="asyncio")
    assert all(p.exists() for p in shm_files["orphans"])

    async def check(session: Any) -> None:
        await check_tools(session)
        await check_shm_and_reclaim(session, root, shm_files)
        plan, r = await plan_and_apply(session, root)
        assert plan["blocked"] is True and len(plan["plan_id"]) == 32, plan
        assert r is None or structured(r)["result"] == "blocked", r
        root.write_manifest_text(root.manifest_path.read_text() + "# an edit\n")
        r = await session.call_tool("host_manage", {"action": "apply", "plan_id": plan["plan_id"]})
        stale = structured(r)
        assert r.is_error and stale["result"] == "stale" and stale["changes"], stale

    anyio.run(on_http, url, TOKEN, check, backend="asyncio")
    recs = [r for r in audit_records(root) if r["front"] == "mcp"]
    assert [r["outcome"] for r in recs if r["action"] == "host_manage"] == ["refused"] * 3, recs
    # The confirmed reclaim over stdio, refused for the loop's lock, is in the trail too.
    locked = [r for r in recs if r["who"] == "stdio"]
    assert [r["outcome"] for r in locked] == ["refused"] and "another reconciler holds" in locked[0]["reason"], recs
    recs = [r for r in recs if r["action"] != "host_manage" and r["who"] != "stdio"]
    assert [(r["action"], r["outcome"]) for r in recs if r["outcome"] != "stale"] in (
        [("shm-reclaim", "ok"), ("apply", "blocked")],
        [("shm-reclaim", "ok")],
    ), recs
    assert recs[-1]["outcome"] == "stale" and all(r["who"] == "ops-token" for r in recs), recs
    assert lp.find("api-exclusive", front="mcp")
