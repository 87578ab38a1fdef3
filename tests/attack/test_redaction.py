"""Each secret form the review found leaking, fed through every way out, for real; and a health URL that redirects.

A real process holds an offload file on a real tmpfs with every form on its command line (bare ``TOKEN=``,
``SECRET=``, ``APIKEY=``, ``MYSQL_PWD=``, ``--passphrase``, ``--auth``, ``--pwd``, an ``X-API-Key:`` header,
``curl -u user:pw``, and a quoted two-word value after ``--api-key``); its command line is read as the tool reads it,
and every way out is asked: ``shm status --json`` and its text, ``plan``, ``status``, ``GET /v1/shm``, MCP's
``host_shared_memory``, the loop's log in both formats and the audit trail. None carries a secret; the pid and the
masks are there.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import subprocess
import sys
import threading
import urllib.request
from typing import Any

import pytest
from e2e_helpers import LoopProcess, Root

pytestmark = [pytest.mark.docker, pytest.mark.root]

SECRETS = {f"s{n}cr3t{n}{n}{n}" for n in range(10)}
S = sorted(SECRETS)
ARGV = [
    f"TOKEN={S[0]}",
    f"SECRET={S[1]}",
    f"APIKEY={S[2]}",
    f"MYSQL_PWD={S[3]}",
    "--passphrase",
    S[4],
    "--auth",
    S[5],
    "--pwd",
    S[6],
    "-H",
    f"X-API-Key: {S[7]}",
    "-u",
    f"admin:{S[8]}",
    "--api-key",
    f"sk {S[9]}",
]
TOKEN = "redaction-token-" + "q" * 20


def test_every_form_through_every_way_out(root: Root, start_loop) -> None:  # type: ignore[no-untyped-def]
    root.manifest()
    root.env["RECONCILER_API_TOKEN"] = TOKEN
    path = root.shm / "vllm_offload_forms.mmap"
    path.write_bytes(b"\0" * 65536)
    with open(path, "rb") as held:
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *ARGV], stdin=held)
    try:
        outputs = [
            root.cli(*args)
            for args in (
                ("shm", "status", "--json"),
                ("shm", "status"),
                ("plan", "--json"),
                ("status", "--json"),
                ("shm", "reclaim", "--json"),
            )
        ]
        shm = outputs[0].data
        [f] = shm["files"]
        [owner] = f["owners"]
        assert owner["pid"] == holder.pid and "***" in owner["command"], owner
        for form in (
            "TOKEN=***",
            "SECRET=***",
            "APIKEY=***",
            "MYSQL_PWD=***",
            "--passphrase ***",
            "--auth ***",
            "--pwd ***",
            "X-API-Key: ***",
            "admin:***",
            "--api-key ***",
        ):
            assert form in owner["command"], (form, owner["command"])
        for text_log in (False, True):
            extra = ("--log-format", "text") if text_log else ()
            lp: LoopProcess = start_loop(*extra)
            try:
                if text_log:
                    import time

                    deadline = time.monotonic() + 30
                    while not any(" pass result=" in ln for ln in lp.other) and time.monotonic() < deadline:
                        time.sleep(0.1)
                else:
                    lp.started()
                req = urllib.request.Request(f"http://{lp.addr}/v1/shm", headers={"Authorization": f"Bearer {TOKEN}"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    api = r.read().decode()
                assert str(holder.pid) in api
                mcp = _mcp_shared_memory(lp.addr)
                assert str(holder.pid) in mcp
                logs = lp.log() + "\n".join(lp.other)
            finally:
                lp.stop()
            outputs_text = api + mcp + logs
            leaked = {s for s in SECRETS if s in outputs_text}
            assert not leaked, (leaked, outputs_text[:2000])
    finally:
        holder.kill()
        holder.wait(timeout=10)
    audit = root.cli("audit", "--json")
    everything = "\n".join(r.stdout + r.stderr for r in [*outputs, audit])
    assert not {s for s in SECRETS if s in everything}, everything[:3000]


def _mcp_shared_memory(addr: str) -> str:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "host_shared_memory", "arguments": {}}}
    ).encode()
    req = urllib.request.Request(
        f"http://{addr}/mcp",
        data=body,
        method="POST",
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_a_health_url_that_redirects_is_not_healthy() -> None:
    """A loopback health URL answering 302 to another address that answers 200: before, urllib followed it and the
    lane counted as healthy. The probe never follows a redirect now."""
    from reconciler.apply.http_check import _http_ok

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            if self.path == "/health":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/elsewhere")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            return

    server = socketserver.TCPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert _http_ok(f"http://127.0.0.1:{port}/elsewhere") is True, "the server itself answers"
        hits.clear()
        assert _http_ok(f"http://127.0.0.1:{port}/health") is False
        assert hits == ["/health"], "the redirect was not followed"
    finally:
        server.shutdown()
        server.server_close()
