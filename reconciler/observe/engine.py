"""A small read-only client of the Docker engine's HTTP API: GET requests that answer JSON, and the event stream.

Why not the Docker SDK: importing it (requests, urllib3, ssl, charset detection) costs about 80 ms, and a
``version="auto"`` client asks the engine for its version before its first call. ``reconciler plan``, a
converged ``apply`` and ``shm status`` only read, so they talk to the engine through this module (the standard
library's socket and json, nothing else) and the SDK is imported only by the writes (``reconciler.docker_ops``).

Speaks HTTP/1.1 over ``unix:///PATH`` and plain ``tcp://`` / ``http://HOST:PORT``; for any other URL (``ssh://``,
``https://``, TLS settings) ``EngineClient.for_url`` returns None and the caller uses the SDK. Each request is
one connection (``Connection: close``), so the client is safe to share between threads. Paths carry no API
version: the engine answers them in its own current version, whose container and event fields this tool reads
have been stable since API 1.24.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit


class EngineError(Exception):
    """The engine answered with an error status (``status``), or not in HTTP at all (``status`` 0)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status} {message}".strip() if status else message)
        self.status = status


class NotFound(EngineError):
    """404: no such container or image (removed between a list and an inspect, say)."""


class EngineClient:
    def __init__(self, family: int, address: str | tuple[str, int], *, timeout: float = 10.0):
        self.family = family
        self.address = address
        self.timeout = timeout

    @classmethod
    def for_url(cls, url: str, *, timeout: float = 10.0) -> EngineClient | None:
        """A client for ``url``, or None when this client does not speak its scheme (the SDK then does)."""
        u = urlsplit(url)
        if u.scheme == "unix" and u.path:
            return cls(socket.AF_UNIX, u.path, timeout=timeout)
        if u.scheme in ("tcp", "http") and u.hostname and not u.path.strip("/"):
            return cls(socket.AF_INET6 if ":" in u.hostname else socket.AF_INET, (u.hostname, u.port or 2375),
                       timeout=timeout)
        return None

    # ------------------------------------------------------------ the calls this tool reads

    def containers(self, *, all: bool = True, quiet: bool = False) -> list[dict[str, Any]]:
        """GET /containers/json: the list API's summaries (``quiet``: ids only, read from the same answer)."""
        listed = self.get("/containers/json", {"all": "1" if all else "0"})
        return [{"Id": c["Id"]} for c in listed] if quiet else listed

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return self.get(f"/containers/{quote(cid, safe='')}/json")

    def inspect_image(self, image: str) -> dict[str, Any]:
        return self.get(f"/images/{quote(image, safe='')}/json")

    def ping(self) -> None:
        """GET /_ping; raises OSError or EngineError when no engine answers there."""
        self._request("/_ping", None)

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return json.loads(self._request(path, params))

    def events(self, filters: Mapping[str, list[str]] | None = None) -> Iterator[dict[str, Any]]:
        """GET /events as a stream of decoded events, until the engine closes it (or the socket fails)."""
        params = {"filters": json.dumps(dict(filters))} if filters else None
        sock, rest, headers = self._open(path="/events", params=params, stream=True)
        try:
            body = _chunks(sock, rest) if headers.get("transfer-encoding") == "chunked" else _raw(sock, rest)
            decoder = json.JSONDecoder()
            buf = ""
            for piece in body:
                buf += piece.decode("utf-8", "replace")
                while True:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    try:
                        ev, end = decoder.raw_decode(buf)
                    except ValueError:
                        break  # an event split over two reads: wait for the rest
                    buf = buf[end:]
                    yield ev
        finally:
            sock.close()

    # ------------------------------------------------------------ HTTP/1.1, the little of it the engine needs

    def _request(self, path: str, params: Mapping[str, str] | None) -> bytes:
        sock, rest, headers = self._open(path=path, params=params, stream=False)
        try:
            length = headers.get("content-length")
            chunked = headers.get("transfer-encoding") == "chunked"
            data = b"".join(_raw(sock, rest, None if chunked or not (length or "").isdigit() else int(length)))
            return _dechunk(data) if chunked else data
        finally:
            sock.close()

    def _open(
        self, *, path: str, params: Mapping[str, str] | None, stream: bool
    ) -> tuple[socket.socket, bytes, dict[str, str]]:
        target = path + ("?" + urlencode(params) if params else "")
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.address)
            if stream:
                sock.settimeout(None)  # the event stream is quiet for as long as nothing happens
            sock.sendall(
                f"GET {target} HTTP/1.1\r\nHost: docker\r\nUser-Agent: reconciler\r\nAccept: application/json\r\n"
                f"Connection: close\r\n\r\n".encode("latin-1")
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                if not chunk:
                    raise EngineError(0, f"the engine closed the connection before answering GET {path}")
                head += chunk
                if len(head) > 1 << 20:
                    raise EngineError(0, f"no HTTP answer to GET {path}")
            head, _, rest = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise EngineError(0, f"not an HTTP answer to GET {path}: {lines[0][:80]!r}")
            status = int(parts[1])
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            if status >= 400:
                if headers.get("transfer-encoding") == "chunked":
                    body = b"".join(_chunks(sock, rest))
                else:
                    body = b"".join(_raw(sock, rest))
                try:
                    message = json.loads(body).get("message", "")
                except (ValueError, AttributeError):
                    message = body.decode("utf-8", "replace")[:300]
                raise (NotFound if status == 404 else EngineError)(status, f"GET {path}: {message}".strip())
            return sock, rest, headers
        except BaseException:
            sock.close()
            raise


def _raw(sock: socket.socket, rest: bytes, length: int | None = None) -> Iterator[bytes]:
    """The body as it arrives: ``length`` bytes, or everything until the engine closes the connection."""
    got = len(rest)
    if rest:
        yield rest
    while length is None or got < length:
        chunk = sock.recv(1 << 18)
        if not chunk:
            if length is not None:
                raise EngineError(0, f"the answer ended after {got} of {length} bytes")
            return
        got += len(chunk)
        yield chunk


def _chunks(sock: socket.socket, buf: bytes) -> Iterator[bytes]:
    """The body of a chunked answer, one chunk at a time (as the event stream needs it)."""

    def fill(n: int) -> bool:
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(1 << 18)
            if not chunk:
                return False
            buf += chunk
        return True

    while True:
        while b"\r\n" not in buf:
            if not fill(len(buf) + 1):
                return
        size_line, _, buf = buf.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
        except ValueError:
            raise EngineError(0, f"a bad chunk size in the engine's answer: {size_line[:20]!r}") from None
        if size == 0:
            return
        if not fill(size + 2):
            raise EngineError(0, "the answer ended inside a chunk")
        yield buf[:size]
        buf = buf[size + 2 :]


def _dechunk(data: bytes) -> bytes:
    """A whole chunked body (read until the engine closed the connection), decoded in one pass."""
    out = []
    pos = 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            raise EngineError(0, "the answer ended inside a chunk header")
        try:
            size = int(data[pos:eol].split(b";")[0].strip() or b"0", 16)
        except ValueError:
            raise EngineError(0, f"a bad chunk size in the engine's answer: {data[pos:eol][:20]!r}") from None
        if size == 0:
            return b"".join(out)
        start = eol + 2
        if start + size > len(data):
            raise EngineError(0, "the answer ended inside a chunk")
        out.append(data[start : start + size])
        pos = start + size + 2
