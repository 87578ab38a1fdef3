"""The listener of a real ``reconciler run`` held by clients that never let go, and what it refuses.

- 300 connections of uid 65534, spread over 50 loopback addresses (127.0.0.2 .. 127.0.0.51) with a small receive
  buffer, each pipelining ``GET /metrics`` and never reading the answers (each one dropped is opened again), and 300
  ``GET /mcp`` event streams of a client that has the token: before, every route went unanswered while they held
  (a connection in the middle of an answer is never idle, so neither eviction nor the head timeout reached it). Now a
  peer is a local user (the uid that owns the connecting socket) or a remote address, each bounded, an answer that is
  not taken within ``WRITE_TIMEOUT_S`` drops its connection, the event streams are bounded, and /healthz and
  /metrics have their own small pool: they answer within 2 s throughout, to root and to a user of its own;
- every refusal (401, 403, 413, 421, 429) is counted in ``reconciler_http_refusals_total`` and audited, at most
  ``REFUSALS_AUDITED`` records a peer in each ``REFUSAL_WINDOW_S``, the rest summed up in one record and one log line
  per peer ("N more refusals from PEER dropped in the last M s"): 2,000 bad requests leave a bounded trail.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from e2e_helpers import Root, wait_until

from attack.helpers import PYTHON, Attacker, as_user
from attack.test_listener import TOKEN, get, loop_with_token

pytestmark = [pytest.mark.docker, pytest.mark.root]

# Non-reading clients: each connection from 127.0.0.(2 + i % 50), a 1 KiB receive buffer, GET /metrics pipelined,
# never a byte read; a connection the server dropped is opened again. Prints "ready" and, at the end, the drops.
NON_READERS = r"""
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
req = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port

def opened(i):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.bind(("127.0.0.%d" % (2 + i % 50), 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s

socks = [opened(i) for i in range(n)]
print("ready", sum(s is not None for s in socks), flush=True)
end = time.monotonic() + hold
dropped = 0
again = [0.0] * n
while time.monotonic() < end:
    for i, s in enumerate(socks):
        if s is not None:
            try:
                s.send(req * 16)
                continue
            except BlockingIOError:
                continue
            except OSError:
                s.close()
                dropped += 1
                socks[i], again[i] = None, time.monotonic() + 2
                continue
        if time.monotonic() >= again[i]:
            socks[i] = opened(i)
    time.sleep(0.5)
print("dropped", dropped, flush=True)
"""

# Event streams: GET /mcp with the token (read from stdin), each held open and read; one the server closed is opened
# again. Prints "ready" and, at the end, how many answers were 200 (a stream) and 429 (refused).
STREAMS = r"""
import collections, select, socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
token = sys.stdin.readline().strip()
req = ("GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n"
       % (port, token)).encode()
seen = collections.Counter()
heads = {}

def opened():
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(req)
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    heads[s] = b""
    return s

socks = [opened() for _ in range(n)]
print("ready", sum(s is not None for s in socks), flush=True)
end = time.monotonic() + hold
again = [0.0] * n
while time.monotonic() < end:
    live = [s for s in socks if s is not None]
    readable = select.select(live, [], [], 0.5)[0] if live else []
    for s in readable:
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if s in heads:
            heads[s] += data
            if b"\r\n" in heads[s] or not data:
                seen[heads.pop(s).split(b" ")[1:2][0].decode() if data else "closed"] += 1
        if not data:
            s.close()
            i = socks.index(s)
            socks[i], again[i] = None, time.monotonic() + 2
    socks = [s if s is not None or time.monotonic() < again[i] else opened() for i, s in enumerate(socks)]
    time.sleep(0.5)
print("seen", " ".join("%s=%d" % kv for kv in sorted(seen.items())), flush=True)
"""

HOLD_S = 24.0


def _timed(port: int, path: str, *, addr: str = "127.0.0.1") -> tuple[int, float]:
    t = time.monotonic()
    try:
        status = get(port, path, timeout=2, addr=addr)[0]
    except OSError:
        status = 0
    return status, time.monotonic() - t


# A user's own check from 127.0.0.1, run as uid 65532 (another user than the attacker's).
OTHER_USER_HEALTHZ = r"""
import http.client, sys, time
t = time.monotonic()
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=2)
c.request("GET", "/healthz")
print(c.getresponse().status, round(time.monotonic() - t, 3))
"""


def test_health_and_metrics_answer_while_non_readers_and_streams_hold(
    root: Root, attacker: Attacker, loops: Any
) -> None:
    from reconciler.api.limits import MAX_STREAMS, WRITE_TIMEOUT_S

    root.manifest()
    lp = loop_with_token(root)
    loops.append(lp)
    port = lp.port
    readers = attacker.popen(NON_READERS, str(port), "300", str(HOLD_S))
    streams = as_user(65533, STREAMS, str(port), "300", str(HOLD_S))
    assert streams.stdin is not None
    streams.stdin.write(TOKEN + "\n")
    streams.stdin.flush()
    try:
        for proc in (readers, streams):
            line = proc.stdout.readline().split()  # type: ignore[union-attr]
            assert line[:1] == ["ready"], (line, proc.stderr.read())  # type: ignore[union-attr]
        t0 = time.monotonic()
        answers: list[tuple[str, int, float]] = []
        while time.monotonic() - t0 < HOLD_S - 4:
            for path in ("/healthz", "/metrics"):
                status, took = _timed(port, path)
                answers.append((path, status, took))
            other = subprocess.run(
                ["setpriv", "--reuid", "65532", "--regid", "65532", "--clear-groups", PYTHON, "-c", OTHER_USER_HEALTHZ,
                 str(port)],
                capture_output=True, text=True, timeout=10, env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            code, took = other.stdout.split() if other.stdout else ("0", "9")
            answers.append((f"/healthz as uid 65532 {other.stderr[-200:]}", int(code), float(took)))
            time.sleep(1)
        late = [a for a in answers if a[1] != 200 or a[2] >= 2.0]
        assert not late, f"{len(late)} of {len(answers)} answers late or failed: {late[:8]}\n{lp.log()}"
    finally:
        out_readers, err_readers = readers.communicate(timeout=HOLD_S + 30)
        out_streams, _ = streams.communicate(timeout=HOLD_S + 30)
    assert "dropped" in out_readers, err_readers
    dropped = int(out_readers.split("dropped")[1].split()[0])
    assert dropped > 0, f"no non-reading connection was dropped within {WRITE_TIMEOUT_S} s: {out_readers}"
    seen = dict(kv.split("=") for kv in out_streams.split("seen")[1].split())
    assert 0 < int(seen.get("200", "0")) <= MAX_STREAMS, seen
    assert int(seen.get("429", "0")) > 0, seen
    # Afterwards every route serves again, and the loop said nothing went wrong.
    assert get(port, "/v1/status", token=TOKEN, timeout=10)[0] == 200
    assert lp.proc.poll() is None and not lp.find("http-listener-died"), lp.log()
    assert "Traceback" not in "\n".join(lp.other)
    text = lp.scrape()
    assert _count(text, "429", "streams") > 0, text
    # An answer not taken: its connection dropped at the write deadline, or closed as idle for a new one.
    drops = [ln for ln in text.splitlines() if ln.startswith("reconciler_http_connections_dropped_total{")]
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in drops) > 0, drops


def _count(text: str, status: str, reason: str) -> float:
    for ln in text.splitlines():
        if (
            ln.startswith("reconciler_http_refusals_total{")
            and f'reason="{reason}"' in ln
            and f'status="{status}"' in ln
        ):
            return float(ln.rsplit(" ", 1)[1])
    return 0.0


# 2,000 requests without a token on 40 keep-alive connections, as uid 65534.
BAD_TOKENS = r"""
import http.client, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
codes = {}
for i in range(40):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(n // 40):
        c.request("GET", "/v1/status", headers={"Authorization": "Bearer wrong-token-wrong-token"})
        r = c.getresponse(); r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    c.close()
print(codes)
"""


def test_every_refusal_is_counted_and_audited_within_a_limit(root: Root, attacker: Attacker, loops: Any) -> None:
    from reconciler.api.limits import REFUSAL_WINDOW_S, REFUSALS_AUDITED

    root.manifest()
    lp = loop_with_token(root)
    loops.append(lp)
    port = lp.port
    mark = lp.mark()
    # One of each: 421 (a rebinding page's Host), 403 (another origin), 413 (a body over the limit), 401.
    assert get(port, "/healthz", host=f"rebind.example:{port}")[0] == 421
    assert get(port, "/metrics", headers={"Origin": "http://evil.example"})[0] == 403
    big = b'{"confirm": false, "pad": "' + b"x" * (70 << 10) + b'"}'
    status, _ = get(
        port, "/v1/shm/reclaim", method="POST", body=big, token=TOKEN, headers={"Content-Type": "application/json"}
    )
    assert status == 413
    assert get(port, "/v1/status")[0] == 401
    text = lp.scrape()
    for code, reason in (("421", "host"), ("403", "origin"), ("413", "body-size"), ("401", "token")):
        assert _count(text, code, reason) == 1, (code, reason, text)
    records = root.cli("audit", "--json").data["records"]
    refused = {r.get("status"): r for r in records if r.get("outcome") == "refused" and r.get("status")}
    assert set(refused) >= {421, 403, 413, 401}, records
    assert refused[421]["peer"].startswith("uid 0") and refused[421]["path"] == "/healthz", refused[421]
    logged = {e["status"] for e in lp.find("api-refused", after=mark)}
    assert logged >= {421, 403, 413, 401}, lp.log()

    # 2,000 bad tokens from uid 65534: all answered 401 and counted; the trail and the log stay bounded: in each
    # window REFUSALS_AUDITED records, and what was dropped summed up once the window ends.
    mark = lp.mark()
    t0 = time.monotonic()
    flood = attacker.python(BAD_TOKENS, str(port), "2000", timeout=300)
    took = time.monotonic() - t0
    assert flood.stdout.strip() == "{401: 2000}", flood
    assert _count(lp.scrape(), "401", "token") == 2001

    def theirs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        records = [r for r in root.cli("audit", "--json").data["records"] if r.get("peer") == "uid 65534"]
        one = [r for r in records if r["action"] == "authenticate"]
        summed = [r for r in records if r["action"] == "refusals-dropped"]
        return (one, summed) if len(one) + sum(r["count"] for r in summed) == 2000 else None

    one, summed = wait_until(theirs, timeout=REFUSAL_WINDOW_S + 30, every=1.0, what="every refusal accounted for")
    windows = int(took // REFUSAL_WINDOW_S) + 2
    assert summed and len(summed) <= windows and len(one) <= REFUSALS_AUDITED * windows, (len(one), len(summed), took)
    assert len(one) == REFUSALS_AUDITED * len(summed) or len(one) == REFUSALS_AUDITED * (len(summed) + 1), len(one)
    first = summed[0]
    assert first["reason"].startswith(f"{first['count']} more refusals from uid 65534 dropped in the last "), first
    logged = [e for e in lp.find("api-refused", after=mark) if e["peer"] == "uid 65534"]
    assert len(logged) == len(one), lp.log()
    lines = lp.find("api-refusals-dropped", after=mark, peer="uid 65534")
    assert sum(e["count"] for e in lines) == sum(r["count"] for r in summed), lines
    assert lp.proc.poll() is None and "Traceback" not in "\n".join(lp.other)


def test_the_text_audit_names_the_user_of_an_unauthenticated_caller(root: Root, attacker: Attacker, loops: Any) -> None:
    """A request without a valid token is recorded with the uid owning its socket (``peer``), and ``reconciler audit``
    shows it, not only ``--json``: the address alone says nothing of a local user, who has every loopback one."""
    root.manifest()
    lp = loop_with_token(root)
    loops.append(lp)
    assert attacker.python(BAD_TOKENS, str(lp.port), "40", timeout=60).stdout.strip() == "{401: 40}"

    def refused() -> list[dict[str, Any]] | None:
        records = root.cli("audit", "--json").data["records"]
        return [r for r in records if r.get("peer") == "uid 65534" and r["outcome"] == "refused"] or None

    record = wait_until(refused, timeout=30, what="the refusal audited")[0]
    assert record["who"] != "uid 65534", record  # its address: the uid is the peer's alone
    text = root.cli("audit").stdout
    assert f"api ({record['who']}, uid 65534 (nobody))" in text, text


# One connection of uid 65534 that pipelines GET /metrics and never reads: when does the listener reset it? Its TCP
# state says, without a byte read.
ONE_NON_READER = r"""
import socket, sys, time
port = int(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
s.connect(("127.0.0.1", port))
s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port * 50)
t = time.monotonic()
while time.monotonic() - t < 60 and s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 1:
    time.sleep(0.2)  # ESTABLISHED, the first byte of TCP_INFO; a reset makes it CLOSE
print(round(time.monotonic() - t, 1))
"""


def test_a_client_that_does_not_take_its_answer_is_dropped(root: Root, attacker: Attacker, loops: Any) -> None:
    from reconciler.api.limits import WRITE_TIMEOUT_S

    root.manifest()
    lp = loop_with_token(root)
    loops.append(lp)
    after = float(attacker.python(ONE_NON_READER, str(lp.port), timeout=90).stdout)
    assert WRITE_TIMEOUT_S - 1 <= after <= WRITE_TIMEOUT_S + 4, after
    [line] = [ln for ln in lp.scrape().splitlines() if 'dropped_total{reason="write-timeout"}' in ln]
    assert float(line.rsplit(" ", 1)[1]) == 1, line
