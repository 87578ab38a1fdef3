"""One reconciler per host: an advisory lock (flock) on a file that says who holds it.

Taken by ``reconciler apply`` and ``reconciler run``. The kernel drops a flock when its holder dies, so the lock
of a dead process is simply taken over; the file's content (pid, command, start time) is only for the message
that a refused second instance prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from reconciler.errors import ReconcilerError


def lock_dir() -> Path:
    return Path(os.environ.get("RECONCILER_LOCK_DIR", "/run/lock"))


def state_path(host: str) -> Path:
    """Where a running loop publishes its backoff and last pass, for ``reconciler status``."""
    return lock_dir() / f"reconciler-{host}.state.json"


def read_loop_state(host: str) -> dict[str, object] | None:
    """What a running loop last wrote, or None when no live loop wrote it."""
    try:
        data = json.loads(state_path(host).read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data


class LockHeld(ReconcilerError):
    def __init__(self, path: Path, holder: dict[str, object]):
        self.path = path
        self.holder = holder
        who = ", ".join(f"{k} {v}" for k, v in holder.items()) or "unknown holder"
        super().__init__(f"another reconciler holds {path} ({who}); one reconciler per host at a time")


class LockDirUnusable(ReconcilerError):
    """The lock file cannot be created or opened: its directory is missing and cannot be made, read-only, or not
    a directory."""

    def __init__(self, path: Path, exc: OSError):
        self.path = path
        why = exc.strerror or str(exc)
        super().__init__(
            f"cannot take the host lock: {path} cannot be created or opened ({why}"
            f"{': ' + str(exc.filename) if exc.filename and str(exc.filename) != str(path) else ''}); "
            f"make the lock directory {path.parent} writable, or point RECONCILER_LOCK_DIR at a writable directory"
        )


class HostLock:
    def __init__(self, host: str, *, command: str):
        self.path = lock_dir() / f"reconciler-{host}.lock"
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> HostLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LockDirUnusable(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(fd)
            raise LockHeld(self.path, holder) from None
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
