"""The frame format of the loop's socket, which both ends speak (``reconciler.control.client`` in the command line,
``reconciler.control.server`` in the loop), and the limits and deadlines both keep. Standard library and
``reconciler.store.lock`` only: the command line's client imports it before anything of the model.

One JSON object per line. The client sends a request (``argv``, ``root``, ``cwd``, the state directory it would
use, its terminal: ``tty``, ``no_color``, and ``sudo_user``, with ``protocol`` and ``version``), then ``{"answer":
TEXT}`` for a question, the replies to a file request, and ``{"cancel": true}`` on Ctrl-C. The loop's first word is
``{"accepted": true}`` (it runs the command), ``{"other": WHY}`` (not this loop's to answer) or ``{"busy": WHY}``
(no room now); then a stream of ``{"out": N}`` and ``{"err": N}``, each followed by N bytes of output as they are
(not in JSON: ``shm status --json`` of a busy host is megabytes, which escaping twice would double), ``{"ask":
PROMPT}``, ``{"read": PATH, "what": WHAT}`` and ``{"write": PATH, "size": N}`` (the file the command named, read or
written by the client), and ``{"wait": true}`` whenever it said nothing for a while, ended by ``{"exit": CODE}``.
Every frame the client takes is checked against ``_FRAMES`` (keys, types, ranges, sizes); anything else is
``_Garbled``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reconciler.store.lock import lock_dir

PROTOCOL = 2
NO_LOOP_ENV = "RECONCILER_NO_LOOP"
_PREFIX, _SUFFIX = "reconciler-", ".sock"
_MAX_LINE = 1 << 20  # a request, or one answer to a prompt
_MAX_FRAME = 1 << 24  # bytes of output in one frame
_MAX_TEXT = 4096  # characters of a prompt, a reason or a path in a frame
# Deadlines, in seconds. The command line: to connect, for the loop to take its request, and for any word at all
# while the loop runs the command (which says it is still at it every _BEAT_S). The loop: for a client's request,
# and for a client to take what it is sent.
_CONNECT_S = 5.0
_ACK_S = 10.0
_SILENCE_S = 60.0
_BEAT_S = 5.0
_REQUEST_S = 10.0
_WRITE_S = 120.0


def socket_path(host: str) -> Path:
    return lock_dir() / f"{_PREFIX}{host}{_SUFFIX}"


def _peer(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a Unix socket, as the kernel saw it connect or bind."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


@contextlib.contextmanager
def _short(d: Path) -> Iterator[str]:
    """A path to the directory ``d`` through an fd held open: short (a Unix socket's path has at most 107 bytes, and a
    runtime directory under a test's temporary directory plus a host's name can be longer), and the directory that
    was checked, whatever is renamed meanwhile."""
    fd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class _Garbled(Exception):
    """What came is no frame of this protocol (not JSON, a value out of range, a frame cut short): why."""


class _Reader:
    """Bytes from a socket, waited for up to a deadline (``time.monotonic()``; None: for as long as it takes):
    lines of at most ``_MAX_LINE`` bytes and frames of a given size. The socket stays blocking (one reader)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)

    def _more(self, deadline: float | None) -> bool:
        """More bytes into the buffer; False at the end of the stream, TimeoutError past the deadline."""
        while True:
            if deadline is None:
                ready = self._poll.poll()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                ready = self._poll.poll(int(left * 1000) + 1)
            if ready:
                data = self.sock.recv(1 << 16)
                self.buf += data
                return bool(data)

    def line(self, deadline: float | None) -> bytes | None:
        """The next line, None at the end of the stream before any byte of one."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                if i >= _MAX_LINE:
                    raise _Garbled(f"a line over {_MAX_LINE} bytes")
                line = bytes(self.buf[: i + 1])
                del self.buf[: i + 1]
                return line
            if len(self.buf) > _MAX_LINE:
                raise _Garbled(f"a line over {_MAX_LINE} bytes")
            if not self._more(deadline):
                if self.buf:
                    raise _Garbled("a line cut short")
                return None

    def exact(self, n: int, deadline: float | None) -> bytes:
        while len(self.buf) < n:
            if not self._more(deadline):
                raise _Garbled(f"a frame of {n} bytes cut short at {len(self.buf)}")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number of this protocol")


def _decode(line: bytes) -> dict[str, Any]:
    """One JSON object of a line; _Garbled for anything else (NaN and Infinity included, nesting too deep)."""
    try:
        msg = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise _Garbled("not JSON") from None
    if not isinstance(msg, dict):
        raise _Garbled(f"a JSON {type(msg).__name__}, not an object")
    return msg


def _count(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and lo <= v <= hi


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= _MAX_TEXT


def _yes(v: Any) -> bool:
    return v is True


# What the loop may send, each frame's keys and what each value must be: anything else is garbled.
_FRAMES: dict[str, dict[str, Callable[[Any], bool]]] = {
    "accepted": {"accepted": _yes},  # the request is taken: the loop runs it
    "other": {"other": _text},  # not this loop's to answer: nothing was run
    "busy": {"busy": _text},  # no room for another command now: nothing was run
    "out": {"out": _count(0, _MAX_FRAME)},  # then that many bytes of stdout
    "err": {"err": _count(0, _MAX_FRAME)},
    "ask": {"ask": _text},
    "wait": {"wait": _yes},  # still at it
    "read": {"read": _text, "what": _text},  # the client's file, for the service (a saved plan)
    "write": {"write": _text, "size": _count(0, _MAX_FRAME)},  # then that many bytes to write to it
    "exit": {"exit": _count(0, 255)},
}


def _frame(msg: dict[str, Any]) -> str:
    """The kind of a frame from the loop, its shape checked; _Garbled when it is none of ``_FRAMES``."""
    kinds = [k for k in _FRAMES if k in msg]
    if len(kinds) != 1 or set(msg) != set(_FRAMES[kinds[0]]):
        raise _Garbled("a frame of no kind this protocol has")
    kind = kinds[0]
    for key, ok in _FRAMES[kind].items():
        if not ok(msg[key]):
            raise _Garbled(f"a {kind!r} frame whose {key!r} is {json.dumps(msg[key])[:40]}")
    return kind


def _send_all(sock: socket.socket, data: bytes, timeout: float) -> None:
    """All of ``data``, or TimeoutError when the other end takes none of it for ``timeout`` seconds (a client that
    stopped reading never holds the writer)."""
    view = memoryview(data)
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLOUT)
    while view:
        if not poll.poll(int(timeout * 1000)):
            raise TimeoutError(errno.ETIMEDOUT, f"nothing taken in {timeout:g} s")
        with contextlib.suppress(BlockingIOError):
            view = view[sock.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) :]


def _line(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, ensure_ascii=False).encode() + b"\n"


def _send(sock: socket.socket, msg: dict[str, Any], timeout: float = _WRITE_S) -> None:
    _send_all(sock, _line(msg), timeout)
