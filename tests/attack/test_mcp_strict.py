"""A careless (or hostile) MCP client against ``host_manage``, for real: raw JSON-RPC lines to ``reconciler mcp`` over
stdio, and raw HTTP to ``/mcp`` of a running loop, on a real tmpfs with an orphan offload file.

Before, ``{"action": "reclaim-shared-memory", "confirm": "yes"}`` deleted the orphan and was audited as confirmed;
``"true"``, ``"on"``, ``"y"``, ``1`` and ``1.0`` did the same over /mcp, an unknown argument was ignored and a
duplicate key took the last value. Now each is an error naming the argument and saying nothing was done, the file
stays, and the audit trail has the refusal; only JSON ``true`` confirms.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from e2e_helpers import Root

pytestmark = [pytest.mark.docker, pytest.mark.root]

BAD_CONFIRMS: list[Any] = ["yes", "true", "on", "y", 1, 1.0, "1", [True], {"value": True}]
TOKEN = "mcp-attack-token-" + "z" * 20


def call(n: int, arguments: dict[str, Any]) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "host_manage", "arguments": arguments}}
    )


def bad_lines() -> list[tuple[str, str]]:
    """(why, line) for every refused call: the confirm values, an unknown argument, a duplicate key, deep nesting."""
    out = [
        (f"confirm={v!r}", call(i, {"action": "reclaim-shared-memory", "confirm": v}))
        for i, v in enumerate(BAD_CONFIRMS, start=10)
    ]
    out.append(("unknown argument", call(30, {"action": "reclaim-shared-memory", "confirm": True, "force": True})))
    out.append(
        (
            "duplicate key",
            '{"jsonrpc": "2.0", "id": 31, "method": "tools/call", "params": {"name": '
            '"host_manage", "arguments": {"action": "reclaim-shared-memory", "confirm": false, '
            '"confirm": true}}}',
        )
    )
    nested: Any = True
    for _ in range(40):
        nested = [nested]
    out.append(("deep nesting", call(32, {"action": "reclaim-shared-memory", "confirm": True, "paths": nested})))
    return out


def answers(proc: subprocess.Popen[str], ids: set[int]) -> dict[int, dict[str, Any]]:
    got: dict[int, dict[str, Any]] = {}
    while ids - set(got):
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the server closed its output; stderr: {proc.stderr.read()}"  # type: ignore[union-attr]
        msg = json.loads(line)
        if msg.get("id") in ids:
            got[msg["id"]] = msg
    return got


def test_stdio_refuses_every_confirmation_but_json_true(root: Root) -> None:
    import mcp.types

    root.manifest()
    orphan = root.shm / "vllm_offload_orphan.mmap"
    orphan.write_bytes(b"\0" * 65536)
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "--root", str(root.path), "mcp"],
        env=root.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    try:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": mcp.types.LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "careless", "version": "0"},
            },
        }
        proc.stdin.write(json.dumps(init) + "\n")  # type: ignore[union-attr]
        answers(proc, {1})
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")  # type: ignore[union-attr]
        lines = bad_lines()
        for _, line in lines:
            proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        got = answers(proc, {json.loads(line)["id"] if "id" in line else 0 for _, line in lines})
        for why, line in lines:
            msg = got[json.loads(line)["id"]]
            result = msg.get("result") or {}
            text = json.dumps(msg)
            assert result.get("isError") is True, (why, msg)
            assert "nothing was done" in text, (why, msg)
            assert orphan.exists(), f"{why} removed the orphan"
        assert "must be JSON true or false, not 'yes'" in json.dumps(got[10]), got[10]
        assert "unknown argument 'force'" in json.dumps(got[30]), got[30]
        assert "appears twice" in json.dumps(got[31]) and "deeper" in json.dumps(got[32])
        # JSON true, and only it, confirms.
        proc.stdin.write(call(40, {"action": "reclaim-shared-memory", "confirm": True}) + "\n")  # type: ignore[union-attr]
        done = answers(proc, {40})[40]["result"]
        assert done.get("isError") is False and done["structuredContent"]["confirmed"] is True, done
        assert not orphan.exists()
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=30)
    records = root.cli("audit", "--json").data["records"]
    refused = [r for r in records if r["front"] == "mcp" and r["outcome"] == "refused"]
    confirmed = [r for r in records if r["front"] == "mcp" and r["action"] == "shm-reclaim"]
    assert len(refused) == len(BAD_CONFIRMS) + 3, records
    assert [r["outcome"] for r in confirmed] == ["ok"], confirmed


def test_http_mcp_refuses_them_too(root: Root, start_loop) -> None:  # type: ignore[no-untyped-def]
    import urllib.error
    import urllib.request

    root.manifest()
    root.env["RECONCILER_API_TOKEN"] = TOKEN
    lp = start_loop().started()
    orphan = root.shm / "vllm_offload_orphan.mmap"
    orphan.write_bytes(b"\0" * 65536)

    def post(body: str) -> tuple[int, str]:
        req = urllib.request.Request(
            f"http://{lp.addr}/mcp",
            data=body.encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    for why, line in bad_lines():
        status, text = post(line)
        if why in ("duplicate key", "deep nesting"):
            assert status == 400, (why, status, text)  # refused before the MCP server reads it
        else:
            assert status == 200 and json.loads(text)["result"]["isError"] is True, (why, text)
            assert "nothing was done" in text, (why, text)
        assert orphan.exists(), f"{why} removed the orphan"
    status, text = post(call(50, {"action": "reclaim-shared-memory", "confirm": True}))
    assert status == 200 and json.loads(text)["result"]["structuredContent"]["confirmed"] is True, text
    assert not orphan.exists()
    records = root.cli("audit", "--json").data["records"]
    refused = [r for r in records if r["front"] == "mcp" and r["outcome"] == "refused"]
    # The confirms and the unknown argument refused by the tool; the duplicate key and the nesting by the listener.
    assert [r["action"] for r in refused] == ["host_manage"] * (len(BAD_CONFIRMS) + 1) + ["request"] * 2, refused


def _raw_post(port: int, path: str, body: bytes, ctypes: list[str]) -> tuple[int, str]:
    """A POST with exactly these Content-Type headers (none, one, or several), through http.client."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        c.putheader("Host", f"127.0.0.1:{port}")
        c.putheader("Authorization", f"Bearer {TOKEN}")
        c.putheader("Accept", "application/json, text/event-stream")
        for ct in ctypes:
            c.putheader("Content-Type", ct)
        c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def test_the_strict_checks_hold_whatever_the_content_type_headers_say(root: Root, start_loop) -> None:  # type: ignore[no-untyped-def]
    root.manifest()
    root.env["RECONCILER_API_TOKEN"] = TOKEN
    lp = start_loop().started()
    orphan = root.shm / "vllm_offload_orphan.mmap"
    orphan.write_bytes(b"\0" * 65536)
    dup = (
        b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "host_manage", "arguments": '
        b'{"action": "reclaim-shared-memory", "confirm": false, "confirm": true}}}'
    )
    nested: Any = True
    for _ in range(60):
        nested = [nested]
    deep = call(8, {"action": "reclaim-shared-memory", "confirm": True, "paths": nested}).encode()
    v1_dup = b'{"confirm": false, "confirm": true}'
    cases = [
        # (why, path, body, Content-Type headers, status, what the error says)
        ("a list of types", "/mcp", dup, ["application/json, text/plain"], 400, "Content-Type"),
        ("two headers", "/mcp", dup, ["text/plain", "application/json"], 400, "twice"),
        ("two equal headers", "/mcp", dup, ["application/json", "application/json"], 400, "twice"),
        ("no header", "/mcp", dup, [], 400, "Content-Type"),
        ("another type", "/mcp", dup, ["text/plain"], 400, "Content-Type"),
        ("parameters", "/mcp", dup, ["application/json; charset=utf-8"], 400, "twice"),
        ("depth 60, a list of types", "/mcp", deep, ["application/json, text/plain"], 400, "Content-Type"),
        ("depth 60", "/mcp", deep, ["Application/JSON"], 400, "deeper"),
        ("v1, a list of types", "/v1/shm/reclaim", v1_dup, ["application/json, text/plain"], 400, "Content-Type"),
        ("v1, two headers", "/v1/shm/reclaim", v1_dup, ["text/plain", "application/json"], 400, "twice"),
        ("v1, parameters", "/v1/shm/reclaim", v1_dup, ["application/json;charset=utf-8"], 400, "twice"),
    ]
    for why, path, body, ctypes, want, says in cases:
        status, text = _raw_post(lp.port, path, body, ctypes)
        assert status == want and says in text, (why, status, text)
        assert orphan.exists(), f"{why} removed the orphan"
    assert "sent twice" in _raw_post(lp.port, "/mcp", dup, ["text/plain", "application/json"])[1]
    # The right header and a body that is strict JSON still work.
    status, text = _raw_post(
        lp.port, "/mcp", call(9, {"action": "reclaim-shared-memory", "confirm": True}).encode(), ["application/json"]
    )
    assert status == 200 and json.loads(text)["result"]["structuredContent"]["confirmed"] is True, text
    assert not orphan.exists(), text
