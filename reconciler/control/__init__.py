"""The running loop answers the command line: a local socket, ``reconciler-HOST.sock`` in the runtime directory.

While ``reconciler run`` runs for a host, ``plan``, ``status``, ``audit``, ``probe``, ``shm status`` and the
commands that change the host (``apply``, ``apply FILE``, ``adopt``, ``shm reclaim``) are carried out by it: the
command line (``reconciler.cli.main``) hands its arguments over with ``submit`` before it imports anything of the
model, and the loop runs the very command, ``reconciler.cli.run_command``, in a thread of its own, computed fresh
from the files and the host at that moment, its output streamed back as it is written, so both ways print the same
bytes. A command that changes the host holds the loop's pass lock instead of the host lock file the loop holds, so
it waits for a pass to end rather than being refused; an apply shows the plan the loop computed, asks on the
client's terminal while the loop's passes go on, and runs that plan only if nothing changed meanwhile (else it is
refused as stale, with what changed). The client's Ctrl-C stops an apply at a safe point, as it would stand-alone.

Only root (the user the loop runs as) reaches the socket: it lives in the runtime directory, which both ends
check like sshd's StrictModes (``reconciler.base.fsafe``), the socket file must be the loop user's and 0600, and each end
checks the other's credentials on the connection (``SO_PEERCRED``). A planted directory or socket is refused with
what is wrong and the fix. Without a loop (no socket, or nothing listening) every command runs stand-alone, as it
does with ``RECONCILER_NO_LOOP=1``; a loop of another root, state directory or version answers "not mine" and the
command runs stand-alone too.

Protocol: one JSON object per line. The client sends a request (``argv``, ``root``, ``cwd``, the state directory
it would use, its terminal: ``tty``, ``no_color``, and ``sudo_user``), then ``{"answer": TEXT}`` for a question,
the replies to a file request, and ``{"cancel": true}`` on Ctrl-C. The loop's first word is ``{"accepted": true}``
(it runs the command), ``{"other": WHY}`` (not this loop's to answer) or ``{"busy": WHY}`` (no room now); then a
stream of ``{"out": N}`` and ``{"err": N}``, each followed by N bytes of output as they are (not in JSON: ``shm
status --json`` of a busy host is megabytes, which escaping twice would double), ``{"ask": PROMPT}``, ``{"read":
PATH, "what": WHAT}`` and ``{"write": PATH, "size": N}`` (the file the command named, read or written by the
client: ``ClientFiles``), and ``{"wait": true}`` whenever it said nothing for a while, ended by ``{"exit": CODE}``.

Neither end trusts the other to be quick, and the client trusts nothing it is sent. The loop serves at most
``_MAX_CLIENTS`` connections, ``_MAX_PER_PEER`` of one process, refusing more at once as busy; it drops a
connection that sends no request within ``_REQUEST_S`` and a client that takes nothing for ``_WRITE_S``, and runs
a command only once the client was told it is taken. The client has deadlines to connect, for the request to be
taken and for any word while the command runs; every frame is checked against ``_FRAMES`` (keys, types, ranges,
sizes). A loop that is late or says what is no frame makes a read-only command run stand-alone, saying so in one
line; a destructive one (``destructive``), which that loop may have carried out, fails with exit 1 and is never
run a second time.

The client side imports the standard library and ``reconciler.store.lock`` only (measured: the command line answered
by a loop never loads pydantic, the engine's client or the model).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, cast

from reconciler import __version__
from reconciler.base import fsafe
from reconciler.store.lock import lock_dir, runtime_dir

PROTOCOL = 2
NO_LOOP_ENV = "RECONCILER_NO_LOOP"
_PREFIX, _SUFFIX = "reconciler-", ".sock"
_MAX_LINE = 1 << 20  # a request, or one answer to a prompt
_MAX_CLIENTS = 32  # connections served at once, in all; more are refused as busy at once
_MAX_PER_PEER = 4  # ... and from one process
_FLUSH_AT = 1 << 16  # output held back at most this many characters before it is sent
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
# What the command line does with a loop that did not answer clearly: a read-only command runs stand-alone (and
# says so); one of these may have been carried out by the loop, and is never run a second time.
_DESTRUCTIVE = frozenset({"apply", "adopt"})


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


# ---------------------------------------------------------------- the client (the command line)


class _Unanswered(Exception):
    """The loop did not answer clearly: why, and whether the request may have reached it."""

    def __init__(self, why: str, *, sent: bool):
        super().__init__(why)
        self.why = why
        self.sent = sent


def _connect_in(d: Path, at: str, name: str) -> socket.socket | None:
    """A connection to the loop listening on ``d/name`` (``at``: ``d`` held open), checked; None when nothing listens
    there, _Unanswered when something does but takes no connection in time."""
    path = d / name
    try:
        st = os.lstat(f"{at}/{name}")
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    what = "the running loop's socket"
    if not _trusted(st.st_uid):
        raise fsafe.UnsafePath(
            f"refusing {what} {path}: it is owned by uid {st.st_uid}, not by the running user "
            f"or root; remove it (`rm {path}`): a running loop makes its own"
        )
    if st.st_mode & 0o077:
        raise fsafe.UnsafePath(
            f"refusing {what} {path}: others may use it (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"remove it (`rm {path}`): a running loop makes its own, 0600"
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_CONNECT_S)
    try:
        sock.connect(f"{at}/{name}")
    except (TimeoutError, BlockingIOError):
        sock.close()  # a listener whose backlog is full: a loop that takes no connection now
        raise _Unanswered(f"took no connection within {_CONNECT_S:g} s", sent=False) from None
    except OSError:
        sock.close()  # a socket left by a loop that ended: no loop
        return None
    pid, uid = _peer(sock)
    if not _trusted(uid):
        sock.close()
        raise fsafe.UnsafePath(
            f"refusing {what} {path}: process {pid} of uid {uid} listens on it, not the running "
            f"user or root; stop it and remove {path}"
        )
    sock.settimeout(None)
    return sock


def _candidates() -> tuple[Path, list[str]]:
    """The runtime directory and the loops' sockets in it. A directory that is missing, not ours to read, or that
    another user could have planted holds no loop to talk to: the command runs stand-alone, and refuses that
    directory itself where it uses it (the host lock, the loop's state), naming it and the fix, as before."""
    try:
        d = runtime_dir(create=False)
        names = sorted(n for n in os.listdir(d) if n.startswith(_PREFIX) and n.endswith(_SUFFIX))
    except (OSError, fsafe.UnsafePath):
        return lock_dir(), []
    return d, names


def destructive(args: Any) -> bool:
    """Whether a command changes the host (``apply``, ``adopt``, ``shm reclaim --confirm``): one the loop may have
    carried out is never run again stand-alone."""
    if args.command == "shm":
        return getattr(args, "shm_command", None) == "reclaim" and bool(getattr(args, "confirm", False))
    return args.command in _DESTRUCTIVE


def _shown(text: str) -> str:
    """What the loop said, fit for a terminal: control characters escaped (a reason is the loop's to choose)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _note(path: Path, why: str) -> None:
    print(f"note: the running loop at {path} {_shown(why)}; running it stand-alone", file=sys.stderr)
    sys.stderr.flush()


def submit(args: Any, argv: list[str]) -> int | None:
    """Have the running loop carry out this command (parsed ``args`` of ``argv``); its exit code, or None when no
    loop of this root answers it (then the command runs stand-alone). A socket in the runtime directory that is not
    the loop user's, or that a process of another user listens on, ends the command with an error naming it and
    the fix (exit 1): nothing is sent to it, and nothing runs stand-alone beside a loop that may be real.

    Nothing the loop says is trusted: a loop that takes no connection, does not take the request in time, or
    answers what is no frame of this protocol makes a read-only command run stand-alone, saying so in one line on
    stderr; a destructive one, which that loop may have carried out, fails (exit 1) and is not run again."""
    if os.environ.get(NO_LOOP_ENV):
        return None
    d, names = _candidates()
    if not names:
        return None
    sudo = os.environ.get("SUDO_USER") or None
    request = {
        "protocol": PROTOCOL,
        "version": __version__,
        "argv": argv,
        "root": os.path.abspath(args.root),
        "cwd": os.getcwd(),
        "state_dir": os.environ.get("RECONCILER_STATE_DIR") or None,
        "no_color": bool(os.environ.get("NO_COLOR")),
        "tty": {"in": sys.stdin.isatty(), "out": sys.stdout.isatty(), "err": sys.stderr.isatty()},
        "sudo_user": sudo if sudo is None or _text(sudo) else None,
    }
    changes = destructive(args)
    try:
        with _short(d) as at:
            for name in names:
                path = d / name
                try:
                    sock = _connect_in(d, at, name)
                except _Unanswered as exc:
                    _note(path, exc.why)
                    continue
                if sock is None:
                    continue
                with sock:
                    client = _Client(sock, args, path)
                    try:
                        first = client.open(request)
                    except _Unanswered as exc:
                        if changes and exc.sent:
                            return client.unclear(exc.why)
                        _note(path, exc.why)
                        continue
                    if first == "busy":
                        _note(path, f"is busy ({client.said})")
                        continue
                    if first == "other":
                        continue  # not this loop's: a loop of another root, state directory or version
                    rc = client.run()
                    if rc is not None:
                        return rc
                    _note(path, client.said)
    except (FileNotFoundError, NotADirectoryError):
        return None  # the directory went away meanwhile: no loop
    except fsafe.UnsafePath as exc:
        from reconciler.cli import report_error

        report_error(args, "unsafe_path", str(exc))
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the loop took the command: closed, the loop does not run it
        from reconciler.cli import report_error

        report_error(args, "interrupted", "interrupted")
        return 130
    return None


class _Client:
    """One command answered by the loop: its output written here as it comes, its questions asked here, the files
    it names read and written here (where this process lives: its mount namespace and working directory)."""

    def __init__(self, sock: socket.socket, args: Any, path: Path):
        self.sock = sock
        self.reader = _Reader(sock)
        self.args = args
        self.path = path
        self.said = ""  # the loop's reason (busy, other), or why what it said was not understood
        self.shown = False  # output of the loop's written here: the command can no longer run stand-alone

    def _next(self, deadline: float | None) -> tuple[str, dict[str, Any]]:
        line = self.reader.line(deadline)
        if line is None:
            raise EOFError
        msg = _decode(line)
        kind = _frame(msg)
        if kind in ("out", "err"):
            msg["data"] = self.reader.exact(msg[kind], deadline)
        elif kind == "write":
            msg["data"] = self.reader.exact(msg["size"], deadline)
        return kind, msg

    def open(self, request: dict[str, Any]) -> str:
        """Send the request; the loop's first word: ``accepted``, ``other`` or ``busy``. _Unanswered otherwise."""
        try:
            _send(self.sock, request, _ACK_S)
        except OSError as exc:
            # The request's last byte, its newline, never went: the loop cannot have taken it. It may have said
            # why before it closed (busy).
            with contextlib.suppress(EOFError, OSError, _Garbled):
                kind, msg = self._next(time.monotonic() + 1.0)
                if kind in ("other", "busy"):
                    self.said = str(msg[kind])
                    return kind
            raise _Unanswered(f"took no request ({exc.strerror or type(exc).__name__})", sent=False) from None
        try:
            kind, msg = self._next(time.monotonic() + _ACK_S)
        except TimeoutError:
            raise _Unanswered(f"did not take the request within {_ACK_S:g} s", sent=True) from None
        except EOFError:
            raise _Unanswered("closed the connection without an answer", sent=True) from None
        except _Garbled as exc:
            raise _Unanswered(f"answered what is no frame of this protocol ({exc})", sent=True) from None
        except OSError as exc:
            raise _Unanswered(f"failed to answer ({exc.strerror or type(exc).__name__})", sent=True) from None
        if kind not in ("accepted", "other", "busy"):
            raise _Unanswered(f"answered a {kind!r} frame before taking the request", sent=True)
        self.said = str(msg[kind]) if kind != "accepted" else ""
        return kind

    def unclear(self, why: str, *, taken: bool = False) -> int:
        """A destructive command the loop may have carried out, or one it took and stopped answering: exit 1."""
        from reconciler.cli import report_error

        sys.stdout.flush()
        when = "while it ran the command" if taken else "after the request was sent"
        report_error(
            self.args,
            "loop_unclear",
            f"the running loop at {self.path} {_shown(why)} {when}: it may have carried the command out or not, so it was "
            f"not run stand-alone; see `reconciler audit` for what ran, then run it again if needed (stand-alone "
            f"with {NO_LOOP_ENV}=1 if no loop runs there)",
        )
        return 1

    def run(self) -> int | None:
        """The command, taken by the loop, to its end: its exit code. None (with ``said``) when the loop stopped
        answering clearly before anything of a read-only command was shown: it runs stand-alone then."""
        import signal

        # An apply stops at a safe point on Ctrl-C or SIGTERM, as stand-alone; the loop does the stopping.
        stoppable = self.args.command == "apply"
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)} if stoppable else {}
        try:
            while True:
                try:
                    kind, msg = self._next(time.monotonic() + _SILENCE_S)
                except EOFError:
                    break
                except TimeoutError:
                    return self._unclear(f"said nothing for {_SILENCE_S:g} s")
                except _Garbled as exc:
                    return self._unclear(f"answered what is no frame of this protocol ({exc})")
                except OSError as exc:
                    return self._unclear(f"failed to answer ({exc.strerror or type(exc).__name__})")
                if kind == "exit":
                    sys.stdout.flush()
                    return int(msg["exit"])
                if kind in ("accepted", "other", "busy") or (kind == "ask" and self.args.command != "apply"):
                    return self._unclear(f"answered a {kind!r} frame in the middle of the command")
                if kind in ("read", "write"):
                    mine = getattr(self.args, "plan_file" if kind == "read" else "out", None)
                    if self.args.command not in ("plan", "apply") or msg[kind] != mine:
                        return self._unclear(f"asked for a file this command did not name ({msg[kind][:200]!r})")
                    self._file(kind, msg)
                elif kind != "wait":
                    self._show(kind, msg)
        except KeyboardInterrupt:
            from reconciler.cli import report_error

            sys.stdout.flush()
            report_error(self.args, "interrupted", "interrupted")
            return 130
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if not self.shown and not destructive(self.args):
            self.said = "closed the connection before it answered"
            return None
        if destructive(self.args):
            return self.unclear("closed the connection before the command's end", taken=True)
        from reconciler.cli import report_error

        sys.stdout.flush()
        report_error(
            self.args,
            "loop_gone",
            "the running loop stopped before it answered; see its log, and run the "
            f"command again (stand-alone once no loop runs, or with {NO_LOOP_ENV}=1)",
        )
        return 1

    def _unclear(self, why: str) -> int | None:
        if not self.shown and not destructive(self.args):
            self.said = why
            return None
        return self.unclear(why, taken=True)

    def _show(self, kind: str, msg: dict[str, Any]) -> None:
        if kind in ("out", "err"):
            self.shown = True
            out, other = (sys.stdout, sys.stderr) if kind == "out" else (sys.stderr, sys.stdout)
            other.flush()  # what came first is shown first
            out.flush()
            raw = getattr(out, "buffer", None)
            if raw is not None:
                raw.write(msg["data"])
                raw.flush()
            else:
                out.write(msg["data"].decode("utf-8", "surrogateescape"))
                out.flush()
        elif kind == "ask":
            self.shown = True
            sys.stdout.flush()
            try:
                answer = input(msg["ask"])
            except EOFError:
                answer = ""
            _send(self.sock, {"answer": answer})

    def _file(self, kind: str, msg: dict[str, Any]) -> None:
        """Read or write the file the command named, here, for the loop; what went wrong goes back to it as the
        error it would have met itself (no such file, not the user's own, a system error)."""
        path = msg[kind]
        reply: dict[str, Any]
        data = b""
        try:
            if kind == "read":
                data = fsafe.read_trusted(path, what=msg["what"], limit=_MAX_FRAME)
                reply = {"file": len(data)}
            else:
                # As stand-alone: a terminal or a pipe (``/dev/stdout``) is written to, never renamed over.
                fsafe.write_out(path, msg["data"], what="the plan file")
                reply = {"written": True}
        except FileNotFoundError:
            reply = {"error": "missing"}
        except fsafe.UnsafePath as exc:
            reply = {"error": "unsafe", "message": str(exc)}
        except OSError as exc:
            reply = {"error": "os", "errno": exc.errno or errno.EIO, "message": exc.strerror or str(exc)}
        _send_all(self.sock, _line(reply) + data, _WRITE_S)

    def _stop(self, signum: int, _frame: Any) -> None:
        import signal

        print(f"\n{signal.Signals(signum).name}: finishing at the next safe point", file=sys.stderr)
        with contextlib.suppress(OSError):  # the loop is gone: the answer loop says so
            _send(self.sock, {"cancel": True}, 1.0)


# ---------------------------------------------------------------- the server (in the loop)


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
    """The loop's socket: each connection served in a thread of its own by the command line's own code."""

    def __init__(
        self,
        root: str,
        host: str,
        *,
        serve: Callable[[], dict[str, Any]],
        stop: threading.Event,
        log: Callable[..., None],
    ):
        self.root = root
        self.host = host
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
        self._parser: Any = None
        self._parser_lock = threading.Lock()
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
        args, why = self._args(req) if req is not None else (None, "not a request")
        if args is None or req is None:
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
        from reconciler.cli import run_command
        from reconciler.cli.common import Console

        ch = _Channel(conn, reader)
        tty = req["tty"] if isinstance(req.get("tty"), dict) else {}
        out, err = _Stream(ch, "out", tty.get("out") is True), _Stream(ch, "err", tty.get("err") is True)
        args.console = Console(
            cast(TextIO, out),
            cast(TextIO, err),
            stdin_tty=tty.get("in") is True,
            no_color=req.get("no_color") is True,
            ask=ch.ask,
            local=False,
            cancel=ch.cancel,
        )
        sudo = req.get("sudo_user")
        args.peer = {"uid": uid, "sudo_user": sudo if isinstance(sudo, str) and _text(sudo) else ""}
        args.serve = {**self.serve(), "files": ClientFiles(ch)}
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
                rc = run_command(args)
            except Exception as exc:  # noqa: BLE001 - an answer, never a traceback, and the loop goes on
                self.log(
                    "control-error",
                    command=" ".join(map(str, req.get("argv") or []))[:200],
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
                from reconciler.cli import report_error

                report_error(
                    args, "internal", f"internal error in the running loop ({type(exc).__name__}); see its log"
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

    def _args(self, req: dict[str, Any]) -> tuple[Any, str]:
        """The parsed command of a request, or None and why this loop does not answer it."""
        from reconciler.store.state import DEFAULT_DIR, state_dir

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
        from reconciler.cli import LOOP_COMMANDS, build_parser, command_name

        with self._parser_lock:
            if self._parser is None:
                self._parser = build_parser()
            try:
                args = self._parser.parse_args(argv)
            except SystemExit:
                return None, "arguments this loop does not take"
        if command_name(args) not in LOOP_COMMANDS:
            return None, f"{command_name(args)} runs stand-alone"
        args.root = root
        # Files the command names (plan --out FILE, apply FILE) are the client's: read and written by it, where it
        # lives (ClientFiles), relative to its working directory; the loop never opens them itself.
        return args, ""
