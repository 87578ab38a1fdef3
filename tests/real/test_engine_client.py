"""The small read-only engine client (reconciler/host/engine/http.py) answers what the Docker SDK answers.

The reads of ``plan``, ``status``, ``shm status`` and a converged ``apply`` go through it instead of the SDK (whose
import costs more than the rest of such a command): these tests hold it to the SDK's answers on the real engine,
and to HTTP's chunked framing and the engine's errors on a fake socket server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.host.engine.http import EngineClient, EngineDown, EngineError, EngineSlow, NotFound, _dechunk
from reconciler.observe.containers import EngineObserver


def test_for_url_speaks_unix_and_plain_tcp_only() -> None:
    assert EngineClient.for_url("unix:///var/run/docker.sock").address == "/var/run/docker.sock"
    assert EngineClient.for_url("tcp://127.0.0.1:2375").address == ("127.0.0.1", 2375)
    assert EngineClient.for_url("http://10.0.0.1").address == ("10.0.0.1", 2375)
    for other in ("ssh://me@host", "https://host:2376", "npipe:////./pipe/docker_engine"):
        assert EngineClient.for_url(other) is None  # the SDK reads these


def test_dechunk() -> None:
    assert _dechunk(b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\n\r\n") == b"hello world!"
    with pytest.raises(EngineError):
        _dechunk(b"ff\r\nshort")
    with pytest.raises(EngineError):
        _dechunk(b"zz\r\n")


def _serve_once(path: Path, answer: bytes) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        # Dribbled out in small pieces: the client must reassemble headers, chunks and events.
        for i in range(0, len(answer), 7):
            conn.sendall(answer[i : i + 7])
        conn.close()
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_chunked_answer_split_anywhere(tmp_path: Path) -> None:
    body = b'[{"Id": "abc", "Names": ["/x"]}]'
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"%x\r\n%s\r\n" % (10, body[:10]) + b"%x\r\n%s\r\n" % (len(body) - 10, body[10:]) + b"0\r\n\r\n"
    t = _serve_once(tmp_path / "s", wire)
    assert EngineClient.for_url(f"unix://{tmp_path / 's'}").containers() == [{"Id": "abc", "Names": ["/x"]}]
    t.join(5)


def test_error_status_carries_the_engine_message(tmp_path: Path) -> None:
    body = b'{"message":"No such container: nope"}'
    wire = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    t = _serve_once(tmp_path / "s", wire)
    with pytest.raises(NotFound, match="No such container: nope"):
        EngineClient.for_url(f"unix://{tmp_path / 's'}").inspect_container("nope")
    t.join(5)


def test_events_stream_decodes_each_event(tmp_path: Path) -> None:
    events = [{"Type": "container", "Action": "start", "id": "a" * 64}, {"Type": "container", "Action": "die"}]
    import json

    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (json.dumps(e).encode() + b"\n" for e in events))
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    t = _serve_once(tmp_path / "s", wire)
    assert list(EngineClient.for_url(f"unix://{tmp_path / 's'}").events({"type": ["container"]})) == events
    t.join(5)


def test_no_engine_is_an_unavailable_source(tmp_path: Path) -> None:
    url = f"unix://{tmp_path / 'absent.sock'}"
    containers, source = EngineObserver(url).observe()
    assert containers == () and not source.ok and source.detail.startswith(url)
    with pytest.raises(OSError):
        EngineObserver(url).ping()
    with pytest.raises(EngineDown, match=r"the engine does not answer at .*absent\.sock"):
        EngineObserver(url).ping()


def test_same_answers_as_the_sdk_on_the_real_engine(docker_api: Any, image: str) -> None:
    cid = docker_api.create_container(image, ["/usr/bin/true"], labels={"io.reconciler.test": "engine-client"})["Id"]
    try:
        client = EngineClient.for_url(os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock"))
        assert client is not None
        ours = {c["Id"]: c for c in client.containers(all=True)}
        sdk = {c["Id"]: c for c in docker_api.containers(all=True)}
        assert cid in ours and ours[cid] == sdk[cid]
        # Another container may come or go between two lists (a test before this one still cleaning up): the quiet
        # list is judged by its own answer, ids only, this test's container among them.
        quiet = client.containers(all=True, quiet=True)
        assert cid in {c["Id"] for c in quiet} and all(set(c) == {"Id"} for c in quiet)
        mine, theirs = client.inspect_container(cid), docker_api.inspect_container(cid)
        assert mine["Config"] == theirs["Config"] and mine["HostConfig"] == theirs["HostConfig"]
        assert client.inspect_image(mine["Image"])["Id"] == docker_api.inspect_image(mine["Image"])["Id"]
        with pytest.raises(NotFound):
            client.inspect_container("no-such-container-" + cid[:8])
        client.ping()
    finally:
        docker_api.remove_container(cid, force=True)


# ---------------------------------------------------------------- HTTP/1.1 framing, keep-alive, slow vs down

DOCKER_SOCK = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock").removeprefix("unix://")


@contextlib.contextmanager
def holding_proxy(path: Path, upstream: str, *, hold_s: float) -> Iterator[dict[str, Any]]:
    """A forwarding proxy on the unix socket ``path`` in front of ``upstream`` that, like some socket proxies, keeps
    its client's connection open for ``hold_s`` after the engine closed its side. Yields its counters: accepted
    connections, and the start of what the engine sent back."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(16)
    stats: dict[str, Any] = {"accepted": 0, "answers": b""}
    done = threading.Event()

    def pump(src: socket.socket, dst: socket.socket, *, hold: bool) -> None:
        try:
            while data := src.recv(65536):
                if hold and len(stats["answers"]) < 1 << 16:
                    stats["answers"] += data[:4096]
                dst.sendall(data)
        except OSError:
            pass
        if hold:
            done.wait(hold_s)  # the engine is done; this proxy keeps its side open anyway
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while not done.is_set():
            try:
                client, _ = srv.accept()
            except OSError:
                return
            stats["accepted"] += 1
            engine = socket.socket(socket.AF_UNIX)
            engine.connect(upstream)
            threading.Thread(target=pump, args=(client, engine), kwargs={"hold": False}, daemon=True).start()
            threading.Thread(target=pump, args=(engine, client), kwargs={"hold": True}, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield stats
    finally:
        done.set()
        srv.close()


@pytest.fixture(scope="module")
def many_containers(docker_api: Any, image: str) -> Iterator[list[str]]:
    """Enough created (never started) containers that the engine's list no longer fits its write buffer (4 KiB on
    dockerd) and comes chunked, as on any real host."""
    ids = [
        docker_api.create_container(
            image,
            ["/usr/bin/true"],
            labels={"io.reconciler.test": "engine-client", "io.reconciler.test.pad": "x" * 300},
        )["Id"]
        for _ in range(12)
    ]
    try:
        yield ids
    finally:
        for cid in ids:
            with contextlib.suppress(Exception):
                docker_api.remove_container(cid, force=True)


def test_a_chunked_list_through_a_proxy_that_holds_the_connection_takes_the_time_the_answer_takes(
    many_containers: list[str], tmp_path: Path
) -> None:
    """The engine's container list is chunked; the proxy keeps the connection open for 30 s after the engine's
    last byte. The answer must be read when its last chunk arrives, not when the connection (or the timeout) ends."""
    direct = EngineClient.for_url(f"unix://{DOCKER_SOCK}")
    assert direct is not None
    want = direct.containers(all=True)
    with holding_proxy(tmp_path / "proxy.sock", DOCKER_SOCK, hold_s=30) as stats:
        client = EngineClient.for_url(f"unix://{tmp_path / 'proxy.sock'}", timeout=20)
        assert client is not None
        t0 = time.monotonic()
        got = client.containers(all=True)
        first = time.monotonic() - t0
        t0 = time.monotonic()
        for _ in range(5):
            client.containers(all=True)
            client.ping()
        again = time.monotonic() - t0
        client.close()
    assert {c["Id"] for c in got} == {c["Id"] for c in want} and set(many_containers) <= {c["Id"] for c in got}
    assert b"transfer-encoding: chunked" in stats["answers"].lower(), "the engine's list came chunked"
    assert first < 2.0, f"the list took {first:.2f} s through the proxy: read until close, not until the last chunk"
    assert again < 5.0
    assert stats["accepted"] == 1, "the connection is kept alive and reused for the next requests"


def _fake_engine(path: Path, handler: Any) -> socket.socket:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_an_engine_that_keeps_the_connection_open_answers_by_length_and_by_last_chunk(tmp_path: Path) -> None:
    body = b'[{"Id": "abc"}]'
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n"
        % (len(body), body),
    ]
    requests: list[bytes] = []

    def handler(conn: socket.socket) -> None:
        for answer in answers:  # two answers on one connection, then it stays open
            requests.append(conn.recv(65536))
            conn.sendall(answer)
        time.sleep(30)

    srv = _fake_engine(tmp_path / "e.sock", handler)
    try:
        client = EngineClient(socket.AF_UNIX, str(tmp_path / "e.sock"), timeout=10)
        t0 = time.monotonic()
        assert client.containers() == [{"Id": "abc"}]
        assert client.containers() == [{"Id": "abc"}]
        assert time.monotonic() - t0 < 2.0
        assert len(requests) == 2 and all(b"Connection: close" not in r for r in requests)
    finally:
        srv.close()


def test_a_slow_engine_and_a_dead_one_read_differently(tmp_path: Path) -> None:
    def never_answers(conn: socket.socket) -> None:
        conn.recv(65536)
        time.sleep(30)

    def stalls_mid_answer(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[")
        time.sleep(30)

    for name, handler in (("silent", never_answers), ("stalled", stalls_mid_answer)):
        srv = _fake_engine(tmp_path / f"{name}.sock", handler)
        try:
            url = f"unix://{tmp_path / name}.sock"
            t0 = time.monotonic()
            with pytest.raises(EngineSlow, match=r"the engine answered too slowly \(0\.5 s"):
                EngineClient.for_url(url, timeout=0.5).containers()  # type: ignore[union-attr]
            assert 0.4 < time.monotonic() - t0 < 3
            containers, source = EngineObserver(url, timeout=0.5).observe()
            assert containers == () and not source.ok and source.cause == "slow", source
            assert "answered too slowly (0.5 s" in source.detail
        finally:
            srv.close()

    dead = f"unix://{tmp_path / 'nothing.sock'}"
    _, source = EngineObserver(dead, timeout=0.5).observe()
    assert not source.ok and source.cause == "down" and "the engine does not answer" in source.detail, source

    # A socket whose engine died: the file is there, nothing listens (connection refused).
    gone = socket.socket(socket.AF_UNIX)
    gone.bind(str(tmp_path / "dead.sock"))
    gone.close()
    _, source = EngineObserver(f"unix://{tmp_path / 'dead.sock'}", timeout=0.5).observe()
    assert source.cause == "down" and "does not answer" in source.detail and "refused" in source.detail, source


def test_a_kept_connection_the_engine_closed_while_idle_is_replaced_once(tmp_path: Path) -> None:
    body = b'{"ok": true}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    accepted: list[int] = []

    def one_answer_then_close(conn: socket.socket) -> None:
        accepted.append(1)
        conn.recv(65536)
        conn.sendall(answer)  # keep-alive by HTTP/1.1's default, then an idle close (as a proxy's idle timeout)
        time.sleep(0.1)
        conn.close()

    srv = _fake_engine(tmp_path / "e.sock", one_answer_then_close)
    try:
        client = EngineClient(socket.AF_UNIX, str(tmp_path / "e.sock"), timeout=5)
        assert client.get("/x") == {"ok": True}
        time.sleep(0.3)
        assert client.get("/x") == {"ok": True}
        assert len(accepted) == 2
    finally:
        srv.close()


def test_a_proxys_refusal_names_the_endpoint(tmp_path: Path) -> None:
    page = b"<html><body><h1>403 Forbidden</h1>\nRequest forbidden by administrative rules.\n</body></html>\n"

    def refuses(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\nContent-Type: text/html\r\n\r\n%s" % (len(page), page)
        )
        time.sleep(5)

    srv = _fake_engine(tmp_path / "e.sock", refuses)
    try:
        with pytest.raises(EngineError) as err:
            EngineClient(socket.AF_UNIX, str(tmp_path / "e.sock"), timeout=5).inspect_container("abc")
        assert err.value.status == 403
        assert "GET /containers/abc/json" in str(err.value) and "proxy" in str(err.value)
    finally:
        srv.close()
