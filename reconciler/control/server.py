"""The loop's end of its socket: ``ControlServer`` listens on ``reconciler-HOST.sock`` in the runtime directory and
runs each command a client hands over in a thread of its own, its output streamed back as it is written. Started by
the loop as one of the front-ends it hosts (``reconciler.cli.commands.run`` builds it); what runs a command is the
``Runner`` handed in (the command line's own ``run_command``, so both ways print the same bytes): this module
imports nothing of ``reconciler.cli``.

Neither end trusts the other to be quick. The loop serves at most ``_MAX_CLIENTS`` connections, ``_MAX_PER_PEER``
of one process, refusing more at once as busy; it drops a connection that sends no request within ``_REQUEST_S``
and a client that takes nothing for ``_WRITE_S``, and runs a command only once the client was told it is taken.
Only root or the loop's own user is served (``SO_PEERCRED``); the socket is the loop user's, 0600, in a runtime
directory checked like sshd's StrictModes (``reconciler.base.fsafe``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

from reconciler import __version__
from reconciler.base import fsafe
from reconciler.control.protocol import (
    _BEAT_S,
    _MAX_FRAME,
    _MAX_TEXT,
    _REQUEST_S,
    _WRITE_S,
    PROTOCOL,
    _count,
    _decode,
    _Garbled,
    _line,
    _peer,
    _Reader,
    _send,
    _send_all,
    _short,
    _text,
    _trusted,
    socket_path,
)
from reconciler.store.lock import runtime_dir
from reconciler.store.state import DEFAULT_DIR, state_dir

_MAX_CLIENTS = 32  # connections served at once, in all; more are refused as busy at once
_MAX_PER_PEER = 4  # ... and from one process
_FLUSH_AT = 1 << 16  # output held back at most this many characters before it is sent


@dataclass(frozen=True)
class Client:
    """One client's command as the runner sees it: the client's streams (each reporting the client's own terminal),
    whether its stdin is a terminal, its NO_COLOR, where its questions go, its cancel (its Ctrl-C, its going away,
    the loop stopping), who it is (``uid`` by ``SO_PEERCRED``, ``sudo_user``) and what the service takes inside the
    loop (its pass lock, its action hooks, the client's files)."""

    out: TextIO
    err: TextIO
    stdin_tty: bool
    no_color: bool
    ask: Callable[[str], str]
    cancel: threading.Event
    peer: dict[str, Any]
    serve: dict[str, Any]


class Runner(Protocol):
    """What runs the commands a client hands over (``reconciler.cli.front_ends.CommandRunner``)."""

    def parse(self, argv: list[str], root: str) -> tuple[Any, str]:
        """The command of ``argv`` for ``root``, or None and why this loop does not answer it."""
        ...

    def run(self, command: Any, client: Client) -> int:
        """Run the command for the client, writing to its streams; its exit code."""
        ...

    def fail(self, command: Any, code: str, message: str) -> None:
        """Tell the client of an error that ended its command, as the command line prints one."""
        ...


class _Stream:
    """A client's stdout or stderr as a command sees it: ``isatty`` is the client's; writes go out in order."""

    def __init__(self, channel: _Channel, name: str, tty: bool):
        self.channel = channel
        self.name = name
        self.tty = tty

    def write(self, text: str) -> int:
        self.channel.put(self.name, text)
        return len(text)

    def flush(self) -> None:
        self.channel.flush()

    def isatty(self) -> bool:
        return self.tty


class _Channel:
    """One client's connection: output held in order and sent on flush, questions and their answers, the client's
    files, and its Ctrl-C or disappearance as a cancel. While the command runs, a word at least every ``_BEAT_S``
    tells the client the loop is still at it; a client that takes nothing for ``_WRITE_S`` is dropped (gone)."""

    def __init__(self, sock: socket.socket, reader: _Reader):
        self.sock = sock
        self.reader = reader
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.gone = False
        self._lock = threading.Lock()
        self._pending: list[tuple[str, list[str]]] = []
        self._size = 0
        self._sent_at = time.monotonic()
        self._replies: list[dict[str, Any] | None] = []
        self._answered = threading.Condition()

    def put(self, name: str, text: str) -> None:
        with self._lock:
            if self._pending and self._pending[-1][0] == name:
                self._pending[-1][1].append(text)
            else:
                self._pending.append((name, [text]))
            self._size += len(text)
            full = self._size >= _FLUSH_AT
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending, self._size = self._pending, [], 0
            for name, texts in pending:
                # As the client's own stream would write a str; surrogateescape gives back the bytes of a file name
                # that is not UTF-8, as Python's stdio does under a C locale.
                data = "".join(texts).encode("utf-8", "surrogateescape")
                for i in range(0, len(data), _MAX_FRAME):
                    self._send_raw(
                        b'{"%s": %d}\n' % (name.encode(), len(data[i : i + _MAX_FRAME])) + data[i : i + _MAX_FRAME]
                    )

    def send(self, msg: dict[str, Any], data: bytes = b"") -> None:
        self.flush()
        with self._lock:
            self._send_raw(_line(msg) + data)

    def _send_raw(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            _send_all(self.sock, data, _WRITE_S)
            self._sent_at = time.monotonic()
        except OSError:
            self.gone = True  # the client went away, or takes nothing: the command finishes (an apply at a safe point)
            self.cancel.set()

    def beat(self) -> None:
        """Until the command ends: a ``wait`` frame whenever nothing else was sent for ``_BEAT_S``."""
        while not self.done.wait(_BEAT_S / 2):
            with self._lock:
                if time.monotonic() - self._sent_at >= _BEAT_S:
                    self._send_raw(b'{"wait": true}\n')

    def read_client(self) -> None:
        """The client's side of the conversation, until it closes: answers, file replies, and a cancel."""
        while True:
            try:
                line = self.reader.line(None)
                if line is None:
                    break
                msg = _decode(line)
                if msg.get("cancel") is True:
                    self.cancel.set()
                    continue
                if "file" in msg:
                    n = msg["file"]
                    if not _count(0, _MAX_FRAME)(n):
                        break
                    msg["data"] = self.reader.exact(int(n), time.monotonic() + _WRITE_S)
            except (OSError, _Garbled):
                break
            with self._answered:
                self._replies.append(msg)
                self._answered.notify_all()
        self.cancel.set()
        with self._answered:
            self._replies.append(None)
            self._answered.notify_all()

    def _reply(self) -> dict[str, Any] | None:
        with self._answered:
            while not self._replies:
                self._answered.wait()
            reply = self._replies[0]
            if reply is not None:  # the end stays, for every later question
                self._replies.pop(0)
        return reply

    def ask(self, prompt: str) -> str:
        self.send({"ask": prompt[:_MAX_TEXT]})
        reply = self._reply()
        answer = reply.get("answer") if reply is not None else None
        return answer if isinstance(answer, str) else ""

    def call(self, msg: dict[str, Any], data: bytes = b"") -> dict[str, Any] | None:
        """A request to the client (a file to read or write) and its reply; None when the client is gone."""
        self.send(msg, data)
        return None if self.gone else self._reply()


class ClientFiles:
    """The files a client's command names (``plan --out FILE``, ``apply FILE``), read and written by the client,
    where it lives: its working directory, its user, its mount namespace (a loop run by a unit with PrivateTmp sees
    another /tmp). For the service, in place of ``reconciler.base.fsafe``'s ``read_json`` and ``write_json``, raising
    what those raise."""

    def __init__(self, channel: _Channel):
        self.channel = channel

    def read_json(self, path: str | Path, *, what: str) -> Any:
        reply = self.channel.call({"read": str(path), "what": what[:_MAX_TEXT]})
        if reply is not None and isinstance(reply.get("data"), bytes):
            return json.loads(reply["data"])
        raise self._error(reply, path)

    def write_json(self, path: str | Path, data: Any, *, indent: int | None = 1, sort_keys: bool = True) -> None:
        raw = (json.dumps(data, indent=indent, sort_keys=sort_keys, default=str) + "\n").encode()
        if len(raw) > _MAX_FRAME:
            raise OSError(errno.EFBIG, f"a plan of {len(raw)} bytes, over {_MAX_FRAME}")
        reply = self.channel.call({"write": str(path), "size": len(raw)}, raw)
        if reply is None or reply.get("written") is not True:
            raise self._error(reply, path)

    @staticmethod
    def _error(reply: dict[str, Any] | None, path: str | Path) -> Exception:
        if reply is None:
            return OSError(errno.ECONNRESET, "the command line went away")
        kind, message = reply.get("error"), reply.get("message")
        if kind == "missing":
            return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if kind == "unsafe" and isinstance(message, str):
            return fsafe.UnsafePath(message)
        code = reply.get("errno")
        return OSError(code if _count(1, 4095)(code) else errno.EIO, str(message or "failed")[:_MAX_TEXT])


class ControlServer:
    """The loop's socket: each connection served in a thread of its own, its command run by the ``Runner`` handed
    in."""

    def __init__(
        self,
        root: str,
        host: str,
        *,
        runner: Runner,
        serve: Callable[[], dict[str, Any]],
        stop: threading.Event,
        log: Callable[..., None],
    ):
        self.root = root
        self.host = host
        self.runner = runner
        self.serve = serve  # the service's extras inside the loop: its pass lock and action hooks
        self.stop = stop  # the loop's: an apply in progress stops at a safe point with the loop
        self.log = log
        self.path = socket_path(host)
        self._sock: socket.socket | None = None
        self._ino: int | None = None
        self._slots_lock = threading.Lock()
        self._in_all = 0
        self._per_peer: dict[int, int] = {}
        self._said: dict[str, tuple[float, int]] = {}  # a noisy event: when last logged, how many since
        self._channels: set[_Channel] = set()
        self._channels_lock = threading.Lock()

    def start(self) -> ControlServer:
        """Listen; a socket that cannot be made is logged and the loop goes on without it (the commands then run
        stand-alone, and ``apply`` meets the host lock)."""
        try:
            d = runtime_dir(create=True)
            path = d / self.path.name
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)  # left by a loop that ended: this loop holds the host lock now
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with _short(d) as at:
                sock.bind(f"{at}/{path.name}")
            os.chmod(path, 0o600)
            sock.listen(16)
        except (OSError, fsafe.UnsafePath) as exc:
            self.log(
                "control-unavailable",
                path=str(self.path),
                error=str(exc),
                effect="commands run stand-alone; apply and shm reclaim --confirm meet the host lock",
            )
            return self
        self._sock, self._ino = sock, os.lstat(path).st_ino
        threading.Thread(target=self._accept, name="control", daemon=True).start()
        threading.Thread(target=self._stopping, name="control-stop", daemon=True).start()
        self.log("control", path=str(path))
        return self

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        with contextlib.suppress(OSError):  # not connected: nothing to wake
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        with self._channels_lock:
            for ch in self._channels:
                ch.cancel.set()

    def _stopping(self) -> None:
        """The loop stopping stops every apply in progress at its next safe point (the pass lock it holds would
        otherwise keep the loop waiting until the apply ends)."""
        self.stop.wait()
        with self._channels_lock:
            for ch in self._channels:
                ch.cancel.set()

    def _accept(self) -> None:
        while self._sock is not None:
            sock = self._sock
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            try:
                pid, uid = _peer(conn)
            except OSError:
                conn.close()
                continue
            if not _trusted(uid):
                self._noisy("control-refused", pid=pid, uid=uid, reason="not the loop's user or root")
                conn.close()
                continue
            busy = self._take(pid)
            if not busy:
                try:
                    threading.Thread(
                        target=self._serve, args=(conn, pid, uid), name="control-client", daemon=True
                    ).start()
                    continue
                except RuntimeError as exc:  # no thread to serve it: refused like a full house
                    self._give(pid)
                    busy = f"no thread to serve it ({exc})"
            # Refused at once, never queued: the command line runs stand-alone, saying so, rather than wait.
            with contextlib.suppress(OSError):
                conn.send(_line({"busy": busy}), socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            conn.close()
            self._noisy("control-busy", pid=pid, reason=busy)

    def _take(self, pid: int) -> str:
        """A slot for a connection of process ``pid``; why not, when the loop serves its bound already."""
        with self._slots_lock:
            if self._in_all >= _MAX_CLIENTS:
                return f"{self._in_all} commands in progress, its bound"
            mine = self._per_peer.get(pid, 0)
            if mine >= _MAX_PER_PEER:
                return f"process {pid} has {mine} connections to it already, its bound for one process"
            self._in_all += 1
            self._per_peer[pid] = mine + 1
            return ""

    def _give(self, pid: int) -> None:
        with self._slots_lock:
            self._in_all -= 1
            left = self._per_peer.pop(pid) - 1
            if left:
                self._per_peer[pid] = left

    def _noisy(self, event: str, **fields: Any) -> None:
        """Log an event a flood of clients could repeat: the first, then at most one line every 10 s, saying how
        many were not logged."""
        now = time.monotonic()
        with self._slots_lock:
            last, since = self._said.get(event, (-1e9, 0))
            if now - last < 10:
                self._said[event] = (last, since + 1)
                return
            self._said[event] = (now, 0)
        self.log(event, **fields, **({"not_logged": since} if since else {}))

    def _serve(self, conn: socket.socket, pid: int, uid: int) -> None:
        try:
            with conn:
                self._answer(conn, pid, uid)
        except Exception as exc:  # noqa: BLE001 - one client's trouble must not reach the loop
            self.log("control-error", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self._give(pid)

    def _answer(self, conn: socket.socket, pid: int, uid: int) -> None:
        reader = _Reader(conn)
        try:
            line = reader.line(time.monotonic() + _REQUEST_S)
            req = _decode(line) if line is not None else None
        except TimeoutError:
            self._noisy("control-silent", pid=pid, effect=f"dropped: no request within {_REQUEST_S:g} s")
            return
        except (OSError, _Garbled):
            req = None
        command, why = self._command(req) if req is not None else (None, "not a request")
        if command is None or req is None:
            with contextlib.suppress(OSError):
                _send(conn, {"other": why}, 1.0)
            return
        try:
            # Taken: from here the client knows the command may run. A client that gave up meanwhile is not sent
            # this (its end is closed) and the command does not run.
            _send(conn, {"accepted": True}, 1.0)
        except OSError:
            self.log("control-gone", pid=pid, command=" ".join(req["argv"])[:200], effect="not run")
            return
        ch = _Channel(conn, reader)
        tty = req["tty"] if isinstance(req.get("tty"), dict) else {}
        out, err = _Stream(ch, "out", tty.get("out") is True), _Stream(ch, "err", tty.get("err") is True)
        sudo = req.get("sudo_user")
        client = Client(
            out=cast(TextIO, out),
            err=cast(TextIO, err),
            stdin_tty=tty.get("in") is True,
            no_color=req.get("no_color") is True,
            ask=ch.ask,
            cancel=ch.cancel,
            peer={"uid": uid, "sudo_user": sudo if isinstance(sudo, str) and _text(sudo) else ""},
            serve={**self.serve(), "files": ClientFiles(ch)},
        )
        helpers = [
            threading.Thread(target=ch.read_client, name="control-read", daemon=True),
            threading.Thread(target=ch.beat, name="control-beat", daemon=True),
        ]
        with self._channels_lock:
            self._channels.add(ch)
        if self.stop.is_set():
            ch.cancel.set()
        try:
            for t in helpers:
                t.start()
            try:
                rc = self.runner.run(command, client)
            except Exception as exc:  # noqa: BLE001 - an answer, never a traceback, and the loop goes on
                self.log(
                    "control-error",
                    command=" ".join(map(str, req.get("argv") or []))[:200],
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                self.runner.fail(
                    command, "internal", f"internal error in the running loop ({type(exc).__name__}); see its log"
                )
                rc = 1
            ch.send({"exit": rc if 0 <= rc <= 255 else 1})
        finally:
            ch.done.set()
            with self._channels_lock:
                self._channels.discard(ch)
            # The helpers end before the connection is closed: a thread still reading or writing its descriptor
            # would otherwise meet the next connection given the same number. The shutdown wakes the reader.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            for t in helpers:
                if t.ident is not None:
                    t.join()

    def _command(self, req: dict[str, Any]) -> tuple[Any, str]:
        """The runner's command of a request, or None and why this loop does not answer it."""
        if req.get("protocol") != PROTOCOL or req.get("version") != __version__:
            return None, f"this loop is version {__version__} (protocol {PROTOCOL})"
        argv, root, cwd = req.get("argv"), req.get("root"), req.get("cwd")
        if not (
            isinstance(argv, list)
            and all(isinstance(a, str) for a in argv)
            and isinstance(root, str)
            and isinstance(cwd, str)
            and os.path.isabs(cwd)
        ):
            return None, "not a request"
        if os.path.realpath(root) != os.path.realpath(self.root):
            return None, f"this loop runs for {self.root}"
        theirs = req.get("state_dir")
        if not isinstance(theirs, (str, type(None))):
            return None, "not a request"
        if os.path.realpath(theirs or DEFAULT_DIR) != os.path.realpath(state_dir()):
            return None, f"this loop keeps its state in {state_dir()}"
        # Files the command names (plan --out FILE, apply FILE) are the client's: read and written by it, where it
        # lives (ClientFiles), relative to its working directory; the loop never opens them itself.
        return self.runner.parse(argv, root)
