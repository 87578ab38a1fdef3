"""A small read-only client of the container engine's HTTP API (Docker, or Podman's Docker-compatible service): GET
requests that answer JSON, and the event stream.

Why not the Docker SDK: importing it (requests, urllib3, ssl, charset detection) costs about 80 ms, and a
``version="auto"`` client asks the engine for its version before its first call. ``reconciler plan``, a
converged ``apply`` and ``shm status`` only read, so they talk to the engine through this module (the standard
library's socket and json, nothing else) and the SDK is imported only by the writes (``reconciler.host.engine.docker``).

Speaks HTTP/1.1 over ``unix:///PATH`` and plain ``tcp://`` / ``http://HOST:PORT``; for any other URL (``ssh://``,
``https://``, TLS settings) ``EngineClient.for_url`` returns None and the caller uses the SDK. An answer ends where
HTTP/1.1 says it does (its Content-Length, or its last chunk), never only when the other side closes: a socket proxy
in front of the engine may keep the connection open long after the answer (docs/reference/engines.md). Connections
are kept alive and reused (a few idle ones, shared between threads under a lock); a reused one that the other side
closed meanwhile is replaced once, which is safe because every request here is a GET. Paths carry no API version:
the engine answers them in its own current version, whose container and event fields this tool reads have been
stable since API 1.24.

Every request has one deadline, ``timeout`` seconds for the whole exchange (``docker.timeout_s``). Failing it
raises ``EngineSlow`` ("answered too slowly"); finding nothing there raises ``EngineDown`` ("does not answer"): the
two read differently wherever the engine's state is shown.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from reconciler.host.engine.protocol import DEFAULT_TIMEOUT_S, EngineDown, EngineError, EngineSlow, NotFound, slow_text

_MAX_IDLE = 8  # the observer inspects with at most 8 threads
_HEAD_LIMIT = 1 << 20


class _Stale(Exception):
    """A kept-alive connection turned out closed before this request's answer began."""


class _Conn:
    """One connection and the bytes already read past the last answer on it."""

    __slots__ = ("buf", "reused", "sock")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.reused = False

    def recv(self, deadline: float | None) -> bytes:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline")
            self.sock.settimeout(left)
        return self.sock.recv(1 << 18)

    def fill(self, n: int, deadline: float | None) -> bool:
        """At least ``n`` bytes in ``buf``; False when the other side closed first."""
        while len(self.buf) < n:
            chunk = self.recv(deadline)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def line(self, deadline: float | None) -> bytes | None:
        """The next CRLF-terminated line (without it); None when the other side closed first."""
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                out, self.buf = self.buf[:end], self.buf[end + 2 :]
                return out
            if len(self.buf) > _HEAD_LIMIT or not self.fill(len(self.buf) + 1, deadline):
                return None

    def close(self) -> None:
        self.sock.close()


class EngineClient:
    def __init__(self, family: int, address: str | tuple[str, int], *, timeout: float = DEFAULT_TIMEOUT_S):
        self.family = family
        self.address = address
        self.timeout = timeout
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> EngineClient | None:
        """A client for ``url``, or None when this client does not speak its scheme (the SDK then does)."""
        u = urlsplit(url)
        if u.scheme == "unix" and u.path:
            return cls(socket.AF_UNIX, u.path, timeout=timeout)
        if u.scheme in ("tcp", "http") and u.hostname and not u.path.strip("/"):
            return cls(
                socket.AF_INET6 if ":" in u.hostname else socket.AF_INET, (u.hostname, u.port or 2375), timeout=timeout
            )
        return None

    def close(self) -> None:
        """Close the idle kept-alive connections (a later request opens a new one)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __del__(self) -> None:
        for conn in getattr(self, "_idle", ()):
            conn.close()

    # ------------------------------------------------------------ the calls this tool reads

    def containers(
        self, *, all: bool = True, quiet: bool = False, filters: Mapping[str, list[str]] | None = None
    ) -> list[dict[str, Any]]:
        """GET /containers/json: the list API's summaries (``quiet``: ids only, read from the same answer;
        ``filters``: the engine's, ``{"label": ["KEY=VALUE", ...]}``)."""
        params = {"all": "1" if all else "0"}
        if filters:
            params["filters"] = json.dumps(dict(filters))
        listed = self.get("/containers/json", params)
        return [{"Id": c["Id"]} for c in listed] if quiet else listed

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return self.get(f"/containers/{quote(cid, safe='')}/json")

    def inspect_image(self, image: str) -> dict[str, Any]:
        return self.get(f"/images/{quote(image, safe='')}/json")

    def version(self) -> dict[str, Any]:
        """GET /version: the engine's own description (Podman names itself in ``Components``)."""
        return self.get("/version")

    def ping(self) -> None:
        """GET /_ping; raises ``EngineDown``, ``EngineSlow`` (both OSError) or EngineError when no engine answers."""
        self._request("/_ping", None)

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return json.loads(self._request(path, params))

    def events(self, filters: Mapping[str, list[str]] | None = None) -> Iterator[dict[str, Any]]:
        """GET /events as a stream of decoded events, until the engine closes it (or the socket fails).

        The stream has a connection of its own (never pooled): it is quiet for as long as nothing happens, so only
        its opening is held to the deadline."""
        params = {"filters": json.dumps(dict(filters))} if filters else None
        path = "/events"
        deadline = time.monotonic() + self.timeout
        conn = self._connect(deadline)
        try:
            conn.sock.sendall(self._head(path, params, close=True))
            status, headers = self._read_head(conn, path, deadline)
            conn.sock.settimeout(None)
            if status >= 400:
                self._raise_status(status, path, self._read_body(conn, status, headers, deadline)[0])
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = _chunks(conn, None)
            else:
                body = _until_close(conn)
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
        except TimeoutError:
            raise EngineSlow(f"{slow_text(self.timeout)}: no answer to GET {path}", self.timeout) from None
        finally:
            conn.close()

    # ------------------------------------------------------------ HTTP/1.1, the little of it the engine needs

    def _where(self) -> str:
        return self.address if isinstance(self.address, str) else f"{self.address[0]}:{self.address[1]}"

    def _head(self, path: str, params: Mapping[str, str] | None, *, close: bool = False) -> bytes:
        target = path + ("?" + urlencode(params) if params else "")
        return (
            f"GET {target} HTTP/1.1\r\nHost: docker\r\nUser-Agent: reconciler\r\nAccept: application/json\r\n"
            + ("Connection: close\r\n" if close else "")
            + "\r\n"
        ).encode("latin-1")

    def _connect(self, deadline: float) -> _Conn:
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(self.address)
        except TimeoutError:
            sock.close()
            if self.family == socket.AF_UNIX:
                # A unix socket whose listener does not accept: an engine too busy to take the connection.
                raise EngineSlow(f"{slow_text(self.timeout)}: it did not accept a connection", self.timeout) from None
            raise EngineDown(
                f"the engine does not answer at {self._where()}: no answer to connect within {self.timeout:g} s"
            ) from None
        except OSError as exc:
            sock.close()
            raise EngineDown(f"the engine does not answer at {self._where()}: {exc.strerror or exc}") from None
        return _Conn(sock)

    def _checkout(self, deadline: float) -> _Conn:
        with self._lock:
            if self._idle:
                conn = self._idle.pop()
                conn.reused = True
                return conn
        return self._connect(deadline)

    def _checkin(self, conn: _Conn) -> None:
        conn.reused = False
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _request(self, path: str, params: Mapping[str, str] | None) -> bytes:
        deadline = time.monotonic() + self.timeout
        while True:
            conn = self._checkout(deadline)
            try:
                status, headers = self._send(conn, path, params, deadline)
                body, keep = self._read_body(conn, status, headers, deadline)
            except _Stale:
                conn.close()
                continue  # a kept connection closed while idle: the next one is fresh (or fails for real)
            except (EngineDown, EngineSlow):
                conn.close()
                raise
            except TimeoutError:
                conn.close()
                raise EngineSlow(f"{slow_text(self.timeout)}: no complete answer to GET {path}", self.timeout) from None
            except OSError as exc:
                conn.close()
                raise EngineDown(
                    f"the engine does not answer at {self._where()}: GET {path}: {exc.strerror or exc}"
                ) from None
            except BaseException:
                conn.close()
                raise
            if keep and not conn.buf:
                self._checkin(conn)
            else:
                conn.close()
            if status >= 400:
                self._raise_status(status, path, body)
            return body

    def _send(
        self, conn: _Conn, path: str, params: Mapping[str, str] | None, deadline: float
    ) -> tuple[int, dict[str, str]]:
        try:
            conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
            conn.sock.sendall(self._head(path, params))
            return self._read_head(conn, path, deadline)
        except (BrokenPipeError, ConnectionResetError, _Stale):
            if conn.reused:
                raise _Stale() from None
            raise EngineDown(
                f"the engine does not answer at {self._where()}: it closed the connection before answering GET {path}"
            ) from None

    def _read_head(self, conn: _Conn, path: str, deadline: float | None) -> tuple[int, dict[str, str]]:
        while True:
            start = conn.line(deadline)
            if start is None:
                if conn.buf or not conn.reused:
                    raise EngineDown(
                        f"the engine does not answer at {self._where()}: it closed the connection "
                        f"before answering GET {path}"
                    )
                raise _Stale()
            if start:
                break  # (blank lines before a status line are tolerated, as RFC 9112 allows)
        parts = start.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise EngineError(0, f"not an HTTP answer to GET {path}: {start[:80]!r}")
        status = int(parts[1])
        headers = {"": parts[0]}  # the version, for the keep-alive decision
        while True:
            line = conn.line(deadline)
            if line is None:
                raise EngineError(0, f"the answer to GET {path} ended inside its headers")
            if not line:
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if 100 <= status < 200:
            return self._read_head(conn, path, deadline)  # an interim answer; the real one follows
        return status, headers

    def _read_body(
        self, conn: _Conn, status: int, headers: Mapping[str, str], deadline: float | None
    ) -> tuple[bytes, bool]:
        """The body of an answer, and whether the connection can carry another request afterwards."""
        keep = headers.get("") == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        if status in (204, 304):
            return b"", keep
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return b"".join(_chunks(conn, deadline)), keep
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise EngineError(0, f"a bad Content-Length in the engine's answer: {length[:20]!r}")
            n = int(length)
            if not conn.fill(n, deadline):
                raise EngineError(0, f"the answer ended after {len(conn.buf)} of {n} bytes")
            body, conn.buf = conn.buf[:n], conn.buf[n:]
            return body, keep
        # Neither a length nor chunks: HTTP/1.0 style, the body ends where the connection does.
        return b"".join(_until_close(conn, deadline)), False

    def _raise_status(self, status: int, path: str, body: bytes) -> None:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = ""
        if not message:
            text = " ".join(body.decode("utf-8", "replace").split())[:200]
            if status in (401, 403, 405):
                # An engine answers JSON; a bare page here is a proxy's refusal (an allow-list in front of it).
                message = (
                    f"refused by the proxy in front of the engine ({text or 'no reason given'}); allow "
                    "GET " + path.split("?")[0] + " there (docs/reference/engines.md)"
                )
            else:
                message = text
        raise (NotFound if status == 404 else EngineError)(status, f"GET {path}: {message}".strip())


def _until_close(conn: _Conn, deadline: float | None = None) -> Iterator[bytes]:
    if conn.buf:
        yield conn.buf
        conn.buf = b""
    while chunk := conn.recv(deadline):
        yield chunk


def _chunks(conn: _Conn, deadline: float | None) -> Iterator[bytes]:
    """The body of a chunked answer, one chunk at a time, ending at the last (zero-size) chunk and its trailer."""
    while True:
        size_line = conn.line(deadline)
        if size_line is None:
            raise EngineError(0, "the answer ended inside a chunk header")
        try:
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
        except ValueError:
            raise EngineError(0, f"a bad chunk size in the engine's answer: {size_line[:20]!r}") from None
        if size == 0:
            while True:  # the trailer: header lines up to an empty one
                line = conn.line(deadline)
                if line is None:
                    raise EngineError(0, "the answer ended inside its trailer")
                if not line:
                    return
        if not conn.fill(size + 2, deadline):
            raise EngineError(0, "the answer ended inside a chunk")
        piece, conn.buf = conn.buf[:size], conn.buf[size + 2 :]
        yield piece


def _dechunk(data: bytes) -> bytes:
    """Pure: a whole chunked body, decoded in one pass (the same framing ``_chunks`` reads off a socket)."""
    out: list[bytes] = []
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
