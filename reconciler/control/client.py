"""The command line's end of the loop's socket: ``submit`` hands a command to the running loop of its root and
shows what the loop answers as the command's own output. Called by ``reconciler.cli.main`` before it imports
anything of the model.

Nothing the loop says is trusted. The client has deadlines to connect, for the request to be taken and for any word
while the command runs; every frame is checked (``reconciler.control.protocol``). A loop that is late or says what
is no frame makes a read-only command run stand-alone, saying so in one line; a destructive one (``destructive``),
which that loop may have carried out, fails with exit 1 and is never run a second time. A socket of another user,
or that a process of another user listens on, is refused with what is wrong and the fix.

Standard library, ``reconciler.base`` and ``reconciler.store.lock`` only (measured: the command line answered by a
loop never loads pydantic, the engine's client or the model); its errors are printed as the command line prints
them (``reconciler.base.terminal.print_error``), never through ``reconciler.cli``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from reconciler import __version__
from reconciler.base import fsafe
from reconciler.base.terminal import print_error
from reconciler.control.protocol import (
    _ACK_S,
    _CONNECT_S,
    _MAX_FRAME,
    _PREFIX,
    _SILENCE_S,
    _SUFFIX,
    _WRITE_S,
    NO_LOOP_ENV,
    PROTOCOL,
    _decode,
    _frame,
    _Garbled,
    _line,
    _peer,
    _Reader,
    _send,
    _send_all,
    _short,
    _text,
    _trusted,
)
from reconciler.store.lock import lock_dir, runtime_dir

# What the command line does with a loop that did not answer clearly: a read-only command runs stand-alone (and
# says so); one of these may have been carried out by the loop, and is never run a second time.
_DESTRUCTIVE = frozenset({"apply", "adopt"})


def _report(args: Any, code: str, message: str) -> None:
    """An error that ends the command, printed here as the command line prints one
    (``reconciler.cli.common.report_error``)."""
    print_error(code, message, out=sys.stdout, err=sys.stderr, as_json=bool(getattr(args, "json", False)))


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
        _report(args, "unsafe_path", str(exc))
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the loop took the command: closed, the loop does not run it
        _report(args, "interrupted", "interrupted")
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
        sys.stdout.flush()
        when = "while it ran the command" if taken else "after the request was sent"
        _report(
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
        # An apply stops at a safe point on Ctrl-C or SIGTERM, as stand-alone; the loop does the stopping.
        stoppable = self.args.command == "apply"
        previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)} if stoppable else {}
        try:
            while True:
                try:
                    frame = self._answer_frame()
                except _Unanswered as exc:
                    return self._unclear(exc.why)
                if frame is None:
                    break
                kind, msg = frame
                if kind == "exit":
                    sys.stdout.flush()
                    return int(msg["exit"])
                why = self._out_of_place(kind, msg)
                if why:
                    return self._unclear(why)
                if kind in ("read", "write"):
                    self._file(kind, msg)
                elif kind != "wait":
                    self._show(kind, msg)
        except KeyboardInterrupt:
            sys.stdout.flush()
            _report(self.args, "interrupted", "interrupted")
            return 130
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if not self.shown and not destructive(self.args):
            self.said = "closed the connection before it answered"
            return None
        if destructive(self.args):
            return self.unclear("closed the connection before the command's end", taken=True)
        sys.stdout.flush()
        _report(
            self.args,
            "loop_gone",
            "the running loop stopped before it answered; see its log, and run the "
            f"command again (stand-alone once no loop runs, or with {NO_LOOP_ENV}=1)",
        )
        return 1

    def _answer_frame(self) -> tuple[str, dict[str, Any]] | None:
        """The next frame of the command's answer; None when the loop closed the connection. ``_Unanswered`` with why
        when it said nothing for ``_SILENCE_S``, said what is no frame of the protocol, or its socket failed."""
        try:
            return self._next(time.monotonic() + _SILENCE_S)
        except EOFError:
            return None
        except TimeoutError:
            raise _Unanswered(f"said nothing for {_SILENCE_S:g} s", sent=True) from None
        except _Garbled as exc:
            raise _Unanswered(f"answered what is no frame of this protocol ({exc})", sent=True) from None
        except OSError as exc:
            raise _Unanswered(f"failed to answer ({exc.strerror or type(exc).__name__})", sent=True) from None

    def _out_of_place(self, kind: str, msg: dict[str, Any]) -> str:
        """Why a frame has no place in the middle of this command's answer: a first word again, a question to a
        command that asks none, a file the command did not name. '' when it has one."""
        if kind in ("accepted", "other", "busy") or (kind == "ask" and self.args.command != "apply"):
            return f"answered a {kind!r} frame in the middle of the command"
        if kind in ("read", "write"):
            mine = getattr(self.args, "plan_file" if kind == "read" else "out", None)
            if self.args.command not in ("plan", "apply") or msg[kind] != mine:
                return f"asked for a file this command did not name ({msg[kind][:200]!r})"
        return ""

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
        print(f"\n{signal.Signals(signum).name}: finishing at the next safe point", file=sys.stderr)
        with contextlib.suppress(OSError):  # the loop is gone: the answer loop says so
            _send(self.sock, {"cancel": True}, 1.0)
