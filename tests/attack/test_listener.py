"""A local user and a web page against the listener of a real ``reconciler run`` (/metrics, /healthz, /v1, /mcp).

- 1,100 idle TCP connections from uid 65534: before, ``accept`` failed with EMFILE, the logging handler raised
  while reporting it, the HTTP thread died and nothing said so. Now the soft limit is raised at start, idle
  connections past the cap are closed, a client that sends no request head is dropped, and /healthz answers
  during and after the attack; with the limit pinned at 1,024 the listener still serves once the attacker stops;
- a slow client that never finishes its request head is disconnected;
- a listener that stops anyway is started again and says so (log and metric);
- a forged log line in a request path is escaped; a Host: of a rebinding page is refused on every route, a
  loopback address the listener is bound to is accepted by /mcp, and --api-host adds a name;
- bodies: over the limit chunked is 413, deep nesting is 400, duplicate keys are 400;
- the password of a docker.url in an invalid host file never reaches /metrics or validate's output;
- systemd's notify protocol: READY=1 after the first pass, WATCHDOG=1 pings, STOPPING=1 on SIGTERM.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import LoopProcess, Root, free_port, wait_until

from attack.helpers import Attacker, no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]

TOKEN = "attack-tests-token-" + "y" * 20

# Connects without waiting for each handshake (a full backlog would make a blocking connect wait), holds them.
FLOOD = """
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held = []
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    held.append(s)
time.sleep(2)
print(len(held), flush=True)
time.sleep(hold)
"""


def get(
    port: int,
    path: str,
    *,
    host: str | None = None,
    token: str | None = None,
    timeout: float = 5,
    addr: str = "127.0.0.1",
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(addr, port, timeout=timeout)
    try:
        h = {"Host": host or f"{addr}:{port}", **(headers or {})}
        if token:
            h["Authorization"] = f"Bearer {token}"
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Loop(LoopProcess):
    """``LoopProcess``, optionally under ``prlimit --nofile=SOFT:HARD`` (the open-file limit of a host's default)."""

    def __init__(self, root: Root, *extra: str, prlimit: str | None = None):
        self.root = root
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.args = root.cli_args("run", "--metrics-addr", self.addr, "--resync", "60", "--log-format", "json", *extra)
        if prlimit is not None:
            self.args = ["prlimit", f"--nofile={prlimit}", *self.args]
        self.events = []
        self.other = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            self.args, env=root.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()


def loop_with_token(root: Root, *extra: str, prlimit: str | None = None, text: bool = False) -> LoopProcess:
    root.env["RECONCILER_API_TOKEN"] = TOKEN
    lp = Loop(root, *extra, prlimit=prlimit)
    if text:  # the lines are not JSON: wait for the first pass's line by its text
        wait_until(lambda: any(" pass result=" in ln for ln in lp.other), timeout=30, what="the first pass")
        return lp
    return lp.started()


def test_a_thousand_idle_connections_do_not_silence_the_listener(root: Root, attacker: Attacker, loops: Any) -> None:
    root.manifest()
    lp = loop_with_token(root, prlimit="1024:20000")
    loops.append(lp)
    [raised] = lp.find("nofile-raised")
    assert raised["was"] == 1024 and raised["soft"] == 20000, raised
    port = lp.port
    flood = attacker.popen(FLOOD, str(port), "1100", "20")
    assert int(flood.stdout.readline()) >= 1000, "the attacker holds its connections"
    # While they are held: past the cap the oldest idle ones were closed, so a scrape still gets through.
    status, body = get(port, "/healthz")
    assert status == 200 and json.loads(body)["ok"] is True
    assert get(port, "/metrics")[0] == 200
    flood.kill()
    flood.wait()
    assert get(port, "/v1/status", token=TOKEN)[0] == 200
    assert not lp.find("http-listener-died"), lp.log()
    assert lp.proc.poll() is None


def test_with_the_file_limit_pinned_the_listener_comes_back(root: Root, attacker: Attacker, loops: Any) -> None:
    root.manifest()
    lp = loop_with_token(root, prlimit="1024:1024")
    loops.append(lp)
    port = lp.port
    flood = attacker.popen(FLOOD, str(port), "1100", "3")
    flood.stdout.readline()
    flood.wait(timeout=60)
    status = wait_until(lambda: _status(port, "/healthz") == 200, timeout=30, what="/healthz after the flood")
    assert status
    assert get(port, "/v1/shm", token=TOKEN)[0] == 200
    assert lp.proc.poll() is None and not lp.find("http-listener-died"), lp.log()
    assert "Traceback" not in "\n".join(lp.other)


def _status(port: int, path: str) -> int | None:
    try:
        return get(port, path, timeout=2)[0]
    except OSError:
        return None


def test_a_client_that_never_finishes_its_request_is_dropped(root: Root, attacker: Attacker, loops: Any) -> None:
    from reconciler.api.limits import HEAD_TIMEOUT_S

    root.manifest()
    lp = loop_with_token(root)
    loops.append(lp)
    slow = attacker.python(
        "import socket, sys, time\n"
        "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
        "s.sendall(b'GET /healthz HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nX-Slow: ')\n"
        "t = time.monotonic(); s.settimeout(60)\n"
        "try:\n"
        "    closed = s.recv(1) == b''\n"
        "except ConnectionResetError:\n"
        "    closed = True\n"
        "print(closed, round(time.monotonic() - t, 1))\n",
        str(lp.port),
        timeout=90,
    )
    closed, after = slow.stdout.split()
    assert closed == "True" and HEAD_TIMEOUT_S - 1 <= float(after) <= HEAD_TIMEOUT_S + 5, slow.stdout


def test_log_injection_host_checks_and_bodies(root: Root, attacker: Attacker, loops: Any) -> None:
    root.manifest()
    lp = loop_with_token(root, "--log-format", "text", "--api-host", "gpu-host.example", text=True)
    loops.append(lp)
    port = lp.port
    # A forged line: a newline, a timestamp and an event in the path of an unauthenticated request.
    forged = "2026-01-01T00:00:00.000Z\tsource-up\tsource=docker"
    path = "/x" + urllib.parse.quote("\n" + forged)
    code = attacker.python(
        "import http.client, sys\n"
        "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=5)\n"
        "c.request('GET', sys.argv[2]); print(c.getresponse().status)\n",
        str(port),
        path,
    )
    assert code.stdout.strip() == "401"
    wait_until(lambda: any("api-refused" in ln for ln in lp.other), timeout=10, what="the refusal's log line")
    assert not any(ln.startswith("2026-01-01") or ln.lstrip().startswith("source-up") for ln in lp.other), lp.other
    [refused] = [ln for ln in lp.other if "api-refused" in ln and "/x" in ln]
    assert "\\n2026-01-01" in refused and "\\t" in refused, refused

    # Host: a rebinding page's name is refused on every route, the open ones included; --api-host adds a name.
    for route in ("/metrics", "/healthz", "/v1/status", "/mcp"):
        status, body = get(port, route, host=f"rebind.attacker.example:{port}", token=TOKEN)
        assert status == 421 and b"--api-host" in body, (route, status, body)
    assert get(port, "/healthz", host=f"gpu-host.example:{port}")[0] == 200
    assert get(port, "/healthz", host=f"localhost:{port}")[0] == 200
    assert get(port, "/healthz", headers={"Origin": "http://rebind.attacker.example"})[0] == 403

    # Bodies: chunked past the limit, nested too deep, a duplicate key; none reclaims anything.
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.putrequest("POST", "/v1/shm/reclaim")
    c.putheader("Authorization", f"Bearer {TOKEN}")
    c.putheader("Content-Type", "application/json")
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    chunk = b" " * 8192
    try:
        for _ in range(12):
            c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        c.send(b"0\r\n\r\n")
    except OSError:
        pass  # the server may answer and close before the whole body is sent
    r = c.getresponse()
    assert r.status == 413, (r.status, r.read())
    c.close()
    deep = b"[" * 5000 + b"]" * 5000
    status, body = get(
        port, "/v1/shm/reclaim", method="POST", body=deep, token=TOKEN, headers={"Content-Type": "application/json"}
    )
    assert status == 400 and b"deeper" in body, body
    status, body = get(
        port,
        "/v1/shm/reclaim",
        method="POST",
        body=b'{"confirm": false, "confirm": true}',
        token=TOKEN,
        headers={"Content-Type": "application/json"},
    )
    assert status == 400 and b"twice" in body, body
    records = root.cli("audit", "--json").data["records"]
    reclaims = [r for r in records if r["front"] == "api" and r["action"] == "shm-reclaim"]
    assert [r["outcome"] for r in reclaims] == ["refused"] * 3, reclaims  # 413, too deep, duplicate: audited
    assert "twice" in reclaims[-1]["reason"] and "over" in reclaims[0]["reason"], reclaims
    assert [r["outcome"] for r in records if r["front"] == "api" and r["action"] == "authenticate"] == ["refused"]
    assert lp.proc.poll() is None and "Traceback" not in "\n".join(lp.other)


def test_mcp_answers_on_the_loopback_address_it_is_bound_to(root: Root, loops: Any) -> None:
    root.manifest()
    port = free_port()
    lp = loop_with_token(root, "--metrics-addr", f"127.0.0.2:{port}")
    loops.append(lp)
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    status, body = get(
        port,
        "/mcp",
        addr="127.0.0.2",
        method="POST",
        body=json.dumps(msg).encode(),
        token=TOKEN,
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    assert status == 200 and "host_manage" in body.decode(), (status, body)


def test_a_password_in_an_invalid_docker_url_reaches_neither_metrics_nor_validate(root: Root, loops: Any) -> None:
    root.manifest()
    lp = loop_with_token(root)
    loops.append(lp)
    password = "hunter2-" + "p" * 12
    host = root.path / "configs" / "host.yaml"
    good = host.read_text()
    mark = lp.mark()
    host.write_text(good.replace("unix:///var/run/docker.sock", f"tcp://admin:{password}@gpu host:2375"))
    lp.wait("config-invalid", after=mark, timeout=30)

    def labelled() -> str | None:
        t = lp.scrape()
        return t if "reconciler_manifest_error_info{" in t else None

    text = wait_until(labelled, timeout=10, what="the error label")
    [line] = [ln for ln in text.splitlines() if ln.startswith("reconciler_manifest_error_info{")]
    assert "admin:***@" in line and password not in text, line
    r = root.cli("validate")
    assert r.rc == 1 and "admin:***@" in r.stderr and password not in r.stderr + r.stdout, r
    assert password not in lp.log() + "\n".join(lp.other)
    host.write_text(good)


def test_systemd_notify_ready_watchdog_and_stopping(root: Root, scratch: Path, loops: Any) -> None:
    root.manifest()
    sock_path = scratch / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(1)
    root.env.update(NOTIFY_SOCKET=str(sock_path), WATCHDOG_USEC="1000000")
    got: list[tuple[float, str]] = []
    t0 = time.monotonic()
    lp = LoopProcess(root, "--metrics-addr", f"127.0.0.1:{free_port()}")
    loops.append(lp)

    def heard(what: str) -> bool:
        with contextlib.suppress(TimeoutError):
            got.append((time.monotonic() - t0, sock.recv(4096).decode()))
        return any(m == what for _, m in got)

    wait_until(lambda: heard("READY=1"), timeout=30, what="READY=1")
    lp.wait("pass", timeout=5)  # READY=1 comes after the first pass
    wait_until(lambda: sum(m == "WATCHDOG=1" for _, m in got) >= 2 or heard("-"), timeout=10, what="two pings")
    lp.proc.terminate()
    wait_until(lambda: heard("STOPPING=1"), timeout=30, what="STOPPING=1")
    assert lp.proc.wait(timeout=30) == 0
    sock.close()


def test_a_listener_that_stops_is_started_again_and_says_so() -> None:
    from reconciler.api.listener import Supervisor

    lines: list[tuple[str, dict[str, Any]]] = []
    restarts: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                await send({"type": m["type"] + ".complete"})
                if m["type"] == "lifespan.shutdown":
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sup = Supervisor(
        lambda port: app,
        "127.0.0.1",
        0,
        log=lambda e, **f: lines.append((e, f)),
        on_restart=lambda: restarts.append(1),
        check_every_s=0.1,
    ).start()
    try:
        assert _status(sup.port, "/") == 200
        sup.listener.server.should_exit = True  # the thread ends as if its loop had died
        wait_until(lambda: any(e == "http-listener-restarted" for e, _ in lines), timeout=20, what="the restart")
        assert [e for e, _ in lines if e.startswith("http-listener")] == [
            "http-listener-died",
            "http-listener-restarted",
        ]
        assert restarts == [1] and _status(sup.port, "/") == 200
    finally:
        sup.shutdown()
    no_traceback(json.dumps([f for _, f in lines], default=str))


def test_an_address_held_by_another_process_is_bound_again_with_backoff_never_fatal() -> None:
    """Held at the start, and taken again in the gap of a restart: neither ends the supervisor (main: the first was
    ``cannot start``, the second ``giving up``); each attempt is published, and it serves once the address is free."""
    from reconciler.api.listener import Supervisor

    lines: list[tuple[str, dict[str, Any]]] = []
    states: list[dict[str, Any]] = []
    fatal: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                await send({"type": m["type"] + ".complete"})
                if m["type"] == "lifespan.shutdown":
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    sup = Supervisor(
        lambda _port: app,
        "127.0.0.1",
        port,
        log=lambda e, **f: lines.append((e, f)),
        on_fatal=fatal.append,
        on_state=states.append,
        check_every_s=0.1,
        retry_base_s=0.2,
        retry_max_s=0.4,
    ).start()
    try:
        assert not sup.bound and sup.alive(), "waiting to bind is well: the watchdog keeps pinging"
        wait_until(lambda: sum(e == "http-listener-unbound" for e, _ in lines) >= 3, timeout=10, what="3 attempts")
        assert states[-1]["bound"] is False and states[-1]["addr"] == f"127.0.0.1:{port}", states[-1]
        assert f"pid {os.getpid()}" in states[-1]["holder"], states[-1]
        holder.close()
        wait_until(lambda: sup.bound and _status(port, "/") == 200, timeout=10, what="bound once free")
        assert states[-1] == {"addr": f"127.0.0.1:{port}", "bound": True}
        # Taken in the gap of a restart: bound again once free, never fatal.
        assert sup.listener is not None
        sup.check_every_s = 2.0  # the watch sees the listener gone only once the address is held again
        time.sleep(0.3)
        sup.listener.server.should_exit = True
        sup.listener.thread.join(5)
        sup.listener.sock.close()
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        wait_until(lambda: states[-1]["bound"] is False, timeout=10, what="unbound after the restart's gap")
        holder.close()
        wait_until(lambda: sup.bound and _status(port, "/") == 200, timeout=10, what="bound again")
        assert fatal == [], fatal
    finally:
        holder.close()
        sup.shutdown()
    no_traceback(json.dumps([f for _, f in lines], default=str))
