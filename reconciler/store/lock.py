"""One reconciler per host: an advisory lock (flock) on a file that says who holds it; and the runtime directory.

Taken by ``reconciler apply``, ``reconciler run`` and the service's destructive calls; ``manifest_edit_lock``, by a
switch (``reconciler.service.switch``), serialises the edits of a host's manifest, with or without a loop running. The kernel drops a flock when
its holder dies, so the lock of a dead process is simply taken over; the file's content (pid, command, start time)
is only for the message that a refused second instance prints.

The lock lives in the runtime directory, ``/run/reconciler`` (``$RECONCILER_LOCK_DIR``; systemd's
``RuntimeDirectory=reconciler``), beside the loop's state (``reconciler.store.loop_state``) and its control socket
(``reconciler.control``); the tool makes it 0700 and checks it before each use (``runtime_dir``, through
``reconciler.base.fsafe``): in a directory anyone can write, such as ``/run/lock``, another user could take the lock
first, plant a symlink for root to truncate, or forge the loop's state. The lock file is only written once it is
checked to be ours and locked by us.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from reconciler.base import fsafe
from reconciler.base.errors import ReconcilerError
from reconciler.store.state import checked_host_dir

DEFAULT_DIR = "/run/reconciler"
ENV = "RECONCILER_LOCK_DIR"
_WHAT = "the runtime directory (the host lock and the loop's state)"
_HOW = f"set {ENV} to a directory of the running user's own (mode 0700)"


def lock_dir() -> Path:
    """Where the lock and the loop's state live (not checked: ``runtime_dir`` checks it)."""
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def runtime_dir(*, create: bool) -> Path:
    """``lock_dir()`` checked (``fsafe.check_dir``), made 0700 when missing and ``create``."""
    return fsafe.check_dir(lock_dir(), what=_WHAT, create=create, how=_HOW)


class LockHeld(ReconcilerError):
    code = "lock_held"

    def __init__(self, path: Path, holder: dict[str, object]):
        self.path = path
        self.holder = holder
        who = ", ".join(f"{k} {v}" for k, v in holder.items()) or "unknown holder"
        super().__init__(f"another reconciler holds {path} ({who}); one reconciler per host at a time")


class LockDirUnusable(ReconcilerError):
    """The lock file cannot be created or opened: its directory is missing and cannot be made, read-only, not a
    directory, or not private to the running user."""

    code = "lock_dir_unusable"

    def __init__(self, path: Path, exc: OSError | fsafe.UnsafePath):
        self.path = path
        if isinstance(exc, fsafe.UnsafePath):
            super().__init__(f"cannot take the host lock: {exc}")
            return
        why = exc.strerror or str(exc)
        super().__init__(
            f"cannot take the host lock: {path} cannot be created or opened ({why}"
            f"{': ' + str(exc.filename) if exc.filename and str(exc.filename) != str(path) else ''}); "
            f"make the lock directory {path.parent} writable, or {_HOW}"
        )


def lock_file_name(host: str) -> str:
    """The name of the lock file of ``host`` in the runtime directory (a client proving a listener the loop's finds
    it among the loop's open files: ``reconciler.observe.loop_listener``)."""
    return f"reconciler-{host}.lock"


class HostLock:
    def __init__(self, host: str, *, command: str):
        self.path = lock_dir() / lock_file_name(host)
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> HostLock:
        try:
            runtime_dir(create=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, 0o600)
        except fsafe.UnsafePath as exc:
            raise LockDirUnusable(self.path, exc) from None
        except OSError as exc:
            raise LockDirUnusable(self.path, exc) from None
        try:
            # Never write to a file that is not ours (a hard link to another file, one another user made).
            fsafe.check_fd(fd, self.path, what="the host lock file")
        except fsafe.UnsafePath as exc:
            os.close(fd)
            raise LockDirUnusable(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(fd)
            raise LockHeld(self.path, holder if isinstance(holder, dict) else {}) from None
        info = {
            "pid": os.getpid(),
            "command": self.command,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HostLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def manifest_edit_lock(host: str, *, timeout_s: float = 10.0) -> Iterator[None]:
    """One edit of the host's manifest at a time, in this process and across processes (``reconciler switch`` from
    the command line, the HTTP API and MCP, a loop's and a stand-alone command's alike): an flock on
    ``STATE_DIR/HOST/manifest-edit.lock``, each holder with its own open file, so two threads of one process exclude
    each other as two processes do. Waited for at most ``timeout_s`` (an edit takes milliseconds); then
    TimeoutError, saying who waited for what. The loop's host lock is not this one: a switch goes on while the loop runs."""
    path = checked_host_dir(host, create=True) / "manifest-edit.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, 0o600)
    except OSError as exc:
        raise ReconcilerError(f"cannot take the manifest's edit lock {path}: {exc.strerror or exc}") from None
    try:
        try:
            fsafe.check_fd(fd, path, what="the manifest's edit lock")
        except fsafe.UnsafePath as exc:
            raise ReconcilerError(f"cannot take the manifest's edit lock: {exc}") from None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"another edit of the manifest of {host} held {path} for over {timeout_s:g} s"
                    ) from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
