"""The small read-only engine client (reconciler/observe/engine.py) answers what the Docker SDK answers.

The reads of ``plan``, ``status``, ``shm status`` and a converged ``apply`` go through it instead of the SDK (whose
import costs more than the rest of such a command): these tests hold it to the SDK's answers on the real engine,
and to HTTP's chunked framing and the engine's errors on a fake socket server.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe.docker_obs import DockerObserver
from reconciler.observe.engine import EngineClient, EngineError, NotFound, _dechunk


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
    containers, source = DockerObserver(url).observe()
    assert containers == () and not source.ok and source.detail.startswith(url)
    with pytest.raises(OSError):
        DockerObserver(url).ping()


def test_same_answers_as_the_sdk_on_the_real_engine(docker_api: Any, image: str) -> None:
    cid = docker_api.create_container(image, ["/usr/bin/true"], labels={"io.reconciler.test": "engine-client"})["Id"]
    try:
        client = EngineClient.for_url(os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock"))
        assert client is not None
        ours = {c["Id"]: c for c in client.containers(all=True)}
        sdk = {c["Id"]: c for c in docker_api.containers(all=True)}
        assert cid in ours and ours[cid] == sdk[cid]
        assert {c["Id"] for c in client.containers(all=True, quiet=True)} == set(ours)
        mine, theirs = client.inspect_container(cid), docker_api.inspect_container(cid)
        assert mine["Config"] == theirs["Config"] and mine["HostConfig"] == theirs["HostConfig"]
        assert client.inspect_image(mine["Image"])["Id"] == docker_api.inspect_image(mine["Image"])["Id"]
        with pytest.raises(NotFound):
            client.inspect_container("no-such-container-" + cid[:8])
        client.ping()
    finally:
        docker_api.remove_container(cid, force=True)
