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
check like sshd's StrictModes (``reconciler.fsafe``), the socket file must be the loop user's and 0600, and each end
checks the other's credentials on the connection (``SO_PEERCRED``). A planted directory or socket is refused with
what is wrong and the fix. Without a loop (no socket, or nothing listening) every command runs stand-alone, as it
does with ``RECONCILER_NO_LOOP=1``; a loop of another root, state directory or version answers "not mine" and the
command runs stand-alone too.

Protocol: one JSON object per line. The client sends a request (``argv``, ``root``, ``cwd``, the state directory
it would use, its terminal: ``tty``, ``no_color``), then ``{"answer": TEXT}`` for a question and ``{"cancel": true}``
on Ctrl-C. The loop sends ``{"other": WHY}`` (not answered here: run stand-alone), or a stream of ``{"out": N}`` and
``{"err": N}``, each followed by N bytes of output as they are (not in JSON: ``shm status --json`` of a busy host
is megabytes, which escaping twice would double), and ``{"ask": PROMPT}``, ended by ``{"exit": CODE}``.

The client side imports the standard library and ``reconciler.lock`` only (measured: the command line answered
by a loop never loads pydantic, the engine's client or the model).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, cast

from reconciler import __version__, fsafe
from reconciler.lock import lock_dir, runtime_dir

PROTOCOL = 1
NO_LOOP_ENV = "RECONCILER_NO_LOOP"
_PREFIX, _SUFFIX = "reconciler-", ".sock"
_MAX_LINE = 1 << 20  # a request, or one answer to a prompt
_MAX_CLIENTS = 32  # connections served at once; more wait in the backlog
_FLUSH_AT = 1 << 16  # output held back at most this many characters before it is sent
_MAX_FRAME = 1 << 24  # bytes of output in one frame


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


class _Lines:
    """JSON lines read from a socket, at most ``_MAX_LINE`` bytes each, an output frame's bytes as ``data``; None at
    the end or on garbage."""

    def __init__(self, sock: socket.socket):
        self.file = sock.makefile("rb")

    def next(self) -> dict[str, Any] | None:
        try:
            line = self.file.readline(_MAX_LINE + 1)
            if not line or len(line) > _MAX_LINE or not line.endswith(b"\n"):
                return None
            msg = json.loads(line)
            if not isinstance(msg, dict):
                return None
            for name in ("out", "err"):
                n = msg.get(name)
                if isinstance(n, int) and not isinstance(n, bool):
                    if not 0 <= n <= _MAX_FRAME:
                        return None
                    msg["data"] = self.file.read(n)
                    if len(msg["data"]) != n:
                        return None
        except (OSError, ValueError):
            return None
        return msg


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall(json.dumps(msg, ensure_ascii=False).encode() + b"\n")


# ---------------------------------------------------------------- the client (the command line)


def _connect_in(d: Path, at: str, name: str) -> socket.socket | None:
    """A connection to the loop listening on ``d/name`` (``at``: ``d`` held open), checked; None when nothing listens
    there."""
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
    sock.settimeout(5.0)
    try:
        sock.connect(f"{at}/{name}")
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


def submit(args: Any, argv: list[str]) -> int | None:
    """Have the running loop carry out this command (parsed ``args`` of ``argv``); its exit code, or None when no
    loop of this root answers it (then the command runs stand-alone). A socket in the runtime directory that is not
    the loop user's, or that a process of another user listens on, ends the command with an error naming it and
    the fix (exit 1): nothing is sent to it, and nothing runs stand-alone beside a loop that may be real."""
    if os.environ.get(NO_LOOP_ENV):
        return None
    d, names = _candidates()
    if not names:
        return None
    try:
        request = {
            "protocol": PROTOCOL,
            "version": __version__,
            "argv": argv,
            "root": os.path.abspath(args.root),
            "cwd": os.getcwd(),
            "state_dir": os.environ.get("RECONCILER_STATE_DIR") or None,
            "no_color": bool(os.environ.get("NO_COLOR")),
            "tty": {"in": sys.stdin.isatty(), "out": sys.stdout.isatty(), "err": sys.stderr.isatty()},
        }
        with _short(d) as at:
            for name in names:
                sock = _connect_in(d, at, name)
                if sock is None:
                    continue
                with sock:
                    lines = _Lines(sock)
                    try:
                        _send(sock, request)
                        first = lines.next()
                    except OSError:
                        continue
                    if first is None or "other" in first:
                        continue
                    return _Client(sock, lines, args).run(first)
    except (FileNotFoundError, NotADirectoryError):
        return None  # the directory went away meanwhile: no loop
    except fsafe.UnsafePath as exc:
        from reconciler.cli import report_error

        report_error(args, "unsafe_path", str(exc))
        return 1
    return None


class _Client:
    """One command answered by the loop: its output written here as it comes, its questions asked here."""

    def __init__(self, sock: socket.socket, lines: _Lines, args: Any):
        self.sock = sock
        self.lines = lines
        self.args = args

    def run(self, first: dict[str, Any]) -> int:
        import signal

        # An apply stops at a safe point on Ctrl-C or SIGTERM, as stand-alone; the loop does the stopping.
        stoppable = self.args.command == "apply"
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)} if stoppable else {}
        try:
            msg: dict[str, Any] | None = first
            while msg is not None:
                if "exit" in msg:
                    sys.stdout.flush()
                    return int(msg["exit"])
                self._show(msg)
                msg = self.lines.next()
        except KeyboardInterrupt:
            from reconciler.cli import report_error

            sys.stdout.flush()
            report_error(self.args, "interrupted", "interrupted")
            return 130
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        from reconciler.cli import report_error

        sys.stdout.flush()
        report_error(
            self.args,
            "loop_gone",
            "the running loop stopped before it answered; see its log, and run the "
            f"command again (stand-alone once no loop runs, or with {NO_LOOP_ENV}=1)",
        )
        return 1

    def _show(self, msg: dict[str, Any]) -> None:
        if "data" in msg:
            out, other = (sys.stdout, sys.stderr) if "out" in msg else (sys.stderr, sys.stdout)
            other.flush()  # what came first is shown first
            out.flush()
            raw = getattr(out, "buffer", None)
            if raw is not None:
                raw.write(msg["data"])
                raw.flush()
            else:
                out.write(msg["data"].decode("utf-8", "surrogateescape"))
                out.flush()
        elif "ask" in msg:
            sys.stdout.flush()
            try:
                answer = input(str(msg["ask"]))
            except EOFError:
                answer = ""
            _send(self.sock, {"answer": answer})

    def _stop(self, signum: int, _frame: Any) -> None:
        import signal

        print(f"\n{signal.Signals(signum).name}: finishing at the next safe point", file=sys.stderr)
        with contextlib.suppress(OSError):  # the loop is gone: the answer loop says so
            _send(self.sock, {"cancel": True})


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
    """One client's connection: output held in order and sent on flush, questions and their answers, and its
    Ctrl-C or disappearance as a cancel."""

    def __init__(self, sock: socket.socket, lines: _Lines):
        self.sock = sock
        self.lines = lines
        self.cancel = threading.Event()
        self.gone = False
        self._lock = threading.Lock()
        self._pending: list[tuple[str, list[str]]] = []
        self._size = 0
        self._answers: list[str | None] = []
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

    def send(self, msg: dict[str, Any]) -> None:
        self.flush()
        with self._lock:
            self._send(msg)

    def _send(self, msg: dict[str, Any]) -> None:
        self._send_raw(json.dumps(msg, ensure_ascii=False).encode() + b"\n")

    def _send_raw(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            self.sock.sendall(data)
        except OSError:
            self.gone = True  # the client went away: the command finishes (an apply at its next safe point)
            self.cancel.set()

    def read_client(self) -> None:
        """The client's side of the conversation, until it closes: answers, and a cancel."""
        while True:
            msg = self.lines.next()
            if msg is None:
                break
            if msg.get("cancel") is True:
                self.cancel.set()
            elif isinstance(msg.get("answer"), str):
                with self._answered:
                    self._answers.append(msg["answer"])
                    self._answered.notify_all()
        self.cancel.set()
        with self._answered:
            self._answers.append(None)
            self._answered.notify_all()

    def ask(self, prompt: str) -> str:
        self.send({"ask": prompt})
        with self._answered:
            while not self._answers:
                self._answered.wait()
            answer = self._answers.pop(0)
        return answer or ""


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
        self._slots = threading.BoundedSemaphore(_MAX_CLIENTS)
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
            self._slots.acquire()
            threading.Thread(target=self._serve, args=(conn,), name="control-client", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                pid, uid = _peer(conn)
                if not _trusted(uid):
                    self.log("control-refused", pid=pid, uid=uid, reason="not the loop's user or root")
                    return
                self._answer(conn)
        except Exception as exc:  # noqa: BLE001 - one client's trouble must not reach the loop
            self.log("control-error", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket) -> None:
        lines = _Lines(conn)
        req = lines.next()
        args, why = self._args(req) if req is not None else (None, "not a request")
        if args is None or req is None:
            _send(conn, {"other": why})
            return
        from reconciler.cli import run_command
        from reconciler.cli_common import Console

        ch = _Channel(conn, lines)
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
        args.serve = self.serve()
        threading.Thread(target=ch.read_client, name="control-read", daemon=True).start()
        with self._channels_lock:
            self._channels.add(ch)
        if self.stop.is_set():
            ch.cancel.set()
        try:
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
            ch.send({"exit": rc})
        finally:
            with self._channels_lock:
                self._channels.discard(ch)

    def _args(self, req: dict[str, Any]) -> tuple[Any, str]:
        """The parsed command of a request, or None and why this loop does not answer it."""
        from reconciler.state import DEFAULT_DIR, state_dir

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
        for name in ("plan_file", "out"):  # files named relative to the client's working directory
            value = getattr(args, name, None)
            if isinstance(value, str) and not os.path.isabs(value):
                setattr(args, name, os.path.join(cwd, value))
        return args, ""
