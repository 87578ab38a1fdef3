"""Every file the tool writes, and every file it trusts, goes through here (docs/design.md, safety rule 12).

The tool runs as root beside other users. A directory it keeps files in is checked before use the way sshd's
StrictModes checks ``~/.ssh``: every component from ``/`` down is owned by root or the running user and not
writable by group or others (a sticky world-writable one such as ``/tmp`` may stand above, since no one else can
rename or remove what root owns in it; the next component must then be ours); the directory itself is the
running user's (or root's) and not writable by group or others; a symlink on the way is followed only when root or the running
user made it. A failing one is an ``UnsafePath`` naming it and the fix, never silently used.

Files are written by ``write_atomic``: a temporary file made with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (``mkstemp``) in
the target's own directory, written, fsynced, then renamed over the target, so a planted symlink or file at the
target or at a guessable temporary name is replaced, never followed or truncated. Files read as trusted input (the
lock, the loop's state, saved plans, the API token, the secrets file) are opened with ``O_NOFOLLOW`` and checked
on the open descriptor by ``open_trusted``: a regular file, owned by the running user (or root), not writable by
group or others, with one name, and for secrets not readable by them either.

The operator's root (``--root``, its ``configs/``, ``manifests/`` and every file read from them) is checked the
same way by ``check_trusted`` and ``check_owner``, called by ``reconciler.load.files``: a recipe decides an image and
its mounts, so a root another user can write would let that user run anything as root.

Callers: ``reconciler.store.lock`` and ``reconciler.store.loop_state`` (the runtime directory: the host lock and the loop's state), ``reconciler.store.state``
(the state directory: install id, ownership, history, saved plans, the audit trail), ``reconciler.store.audit``,
``reconciler.service`` (``plan --out`` through ``write_out``, which writes to a terminal or pipe rather than
replace it; ``apply FILE``), ``reconciler.api.tokens`` (the token) and ``reconciler.load.secrets``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reconciler.base.errors import ReconcilerError

_MAX_SYMLINKS = 40  # as the kernel's own limit on a path walk (ELOOP)


class UnsafePath(ReconcilerError):
    """A directory or file another user could have planted or could change: refused, with the fix."""

    code = "unsafe_path"


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _ancestor_problem(path: str, st: os.stat_result, *, types: bool = True) -> str | None:
    if types and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if not _trusted_owner(st.st_uid):
        return f"{path} is owned by {_user(st.st_uid)}, who could replace what lies under it"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}) and not sticky: "
            "anyone could replace what lies under it"
        )
    return None


def _own_problem(path: str, st: os.stat_result, *, kind: str | None = "directory") -> str | None:
    if kind == "directory" and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if kind == "file" and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not _trusted_owner(st.st_uid):
        return f"{path} is owned by {_user(st.st_uid)}, not by the running user ({_user(os.geteuid())}) or root"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _fix(path: str, problem: str) -> str:
    if "owned by" in problem:
        return f"check who made it, remove it or `chown {os.geteuid()} {path}`"
    if "writable by" in problem:
        return f"`chmod go-w {path}`"
    if "symlink" in problem:
        return "replace the symlink by the real path"
    return "give a directory of the running user's own"


def _walk(
    path: Path, *, create: bool, mode: int, last: str | None = "directory", types: bool = True
) -> tuple[str | None, str]:
    """Walk ``path`` from ``/``; returns (problem, the component it is about), or (None, the real path).

    Missing components are made (``mode``) when ``create``; one made meanwhile by someone else is checked like any
    other, so a race to plant it first loses. ``last`` is what the final component must be ("directory"; "any":
    its owner and mode only; None: not checked, only the way to it); without ``types`` no component's file type is
    checked (the caller reports a wrong one in its own words)."""
    if not path.is_absolute():
        path = Path.cwd() / path
    todo = list(path.parts[1:])
    cur = "/"
    hops = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur) or "/"
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # made meanwhile by someone: checked below like any other
                os.mkdir(nxt, mode)
            st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_owner(st.st_uid):
                return f"{nxt} is a symlink made by {_user(st.st_uid)}", nxt
            hops += 1
            if hops > _MAX_SYMLINKS:
                return f"{path}: too many symlinks", nxt
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo = [p for p in target.split("/") if p] + todo
            continue
        final = not any(p not in ("", ".") for p in todo)
        if final:
            problem = _own_problem(nxt, st, kind=None if last == "any" or not types else last) if last else None
        else:
            problem = _ancestor_problem(nxt, st, types=types)
        if problem:
            return problem, nxt
        cur = nxt
    return None, cur


def check_dir(path: str | Path, *, what: str, create: bool = False, mode: int = 0o700, how: str = "") -> Path:
    """``path`` checked like StrictModes (made with ``mode`` where missing, when ``create``); its real path.

    ``what`` names it in the error ("the state directory"); ``how`` says how to choose another one
    ("set RECONCILER_STATE_DIR"). FileNotFoundError when it is missing and not ``create``; OSError when it cannot
    be made."""
    problem, where = _walk(Path(path), create=create, mode=mode)
    if problem:
        alt = f", or {how}" if how else ""
        raise UnsafePath(f"refusing {what} {path}: {problem}; {_fix(where, problem)}{alt}")
    return Path(where)


def check_trusted(path: str | Path, *, what: str, last: str | None = "any") -> None:
    """``path``, a file or directory the tool trusts but the operator writes (the root and its files), checked like
    StrictModes: every component of its real path from ``/`` owned by root or the running user and not writable by
    group or others (a sticky one may stand above), a symlink on the way only root's or the running user's, and the
    path itself (unless ``last`` is None) owned and not writable the same way. Its file type is not checked, and a
    missing component is no problem here: the caller reports those in its own words. UnsafePath names the path and
    the fix (``chown root:root PATH; chmod go-w PATH``)."""
    try:
        problem, where = _walk(Path(path), create=False, mode=0, last=last, types=False)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise UnsafePath(f"refusing {what} {path}: cannot check it: {exc.strerror or exc}") from None
    if problem is None:
        return
    if "symlink" in problem:
        fix = f"`chown -h root:root {where}`, or replace the symlink by the real path"
    else:
        fix = f"`chown root:root {where}; chmod go-w {where}`"
    raise UnsafePath(f"refusing {what} {path}: {problem}; {fix}")


def check_owner(st: os.stat_result, path: str | Path, *, what: str) -> None:
    """An opened file's ``st`` (from ``path``) owned by root or the running user and not writable by group or
    others, as ``check_trusted`` wants it; UnsafePath with the fix otherwise."""
    problem = _own_problem(str(path), st, kind=None)
    if problem:
        raise UnsafePath(f"refusing {what} {path}: {problem}; `chown root:root {path}; chmod go-w {path}`")


def check_fd(fd: int, path: str | Path, *, what: str, secret: bool = False) -> os.stat_result:
    """The open file ``fd`` (from ``path``): a regular file of the running user's, not writable by group or others
    (with ``secret``, not readable by them either); UnsafePath otherwise."""
    st = os.fstat(fd)
    problem = _own_problem(str(path), st, kind="file")
    if problem is None and st.st_nlink > 1:
        problem = f"{path} has {st.st_nlink} hard links: another name could change it"
    if problem is None and secret and st.st_mode & 0o077:
        problem = f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o})"
        raise UnsafePath(f"refusing {what} {path}: {problem}; it holds secrets: `chmod 600 {path}`")
    if problem:
        raise UnsafePath(f"refusing {what} {path}: {problem}; {_fix(str(path), problem)}")
    return st


@contextlib.contextmanager
def open_trusted(
    path: str | Path, *, what: str, secret: bool = False, flags: int = os.O_RDONLY, mode: int = 0o600
) -> Iterator[int]:
    """An fd of ``path`` opened without following a final symlink and checked by ``check_fd`` (closed after).
    FileNotFoundError when it is missing (and ``flags`` has no O_CREAT); UnsafePath for a symlink or a bad file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {what} {path}: it is a symlink; replace it by the file itself") from None
        raise
    try:
        check_fd(fd, path, what=what, secret=secret)
        if not flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


def read_trusted(path: str | Path, *, what: str, secret: bool = False, limit: int = 16 << 20) -> bytes:
    """The content of a trusted file (``open_trusted``), at most ``limit`` bytes."""
    with open_trusted(path, what=what, secret=secret) as fd:
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def write_atomic(
    path: str | Path, data: bytes | str, *, mode: int = 0o600, replace: bool = True, durable: bool = True
) -> None:
    """Replace ``path`` by a file holding ``data`` (``mode``), atomically: a fresh temporary file in the same
    directory (``O_EXCL|O_NOFOLLOW``), fsynced, renamed over it, and the directory fsynced. With ``replace=False``
    the file is linked in only where nothing is yet (FileExistsError otherwise: two writers, one winner). With
    ``durable=False`` nothing is fsynced (state that lives in the runtime directory and means nothing after a
    reboot, written several times a second: readers still see a whole file, old or new). OSError on failure (the
    temporary file is removed)."""
    # Imported here: tempfile (with shutil, random) is 3 ms of every command that only checks a directory, such as
    # the command line finding a running loop's socket (reconciler.control).
    import tempfile

    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_json(
    path: str | Path, data: Any, *, indent: int | None = 1, sort_keys: bool = True, durable: bool = True
) -> None:
    """``write_atomic`` of ``data`` as JSON (one trailing newline), mode 0600."""
    write_atomic(path, json.dumps(data, indent=indent, sort_keys=sort_keys, default=str) + "\n", durable=durable)


def _links_trusted(path: str) -> bool:
    """Whether every symlink ``path`` goes through, itself first, was made by root or the running user. A link of
    the kernel's own (``/proc/self/fd/1`` naming ``pipe:[…]``) ends the walk: the process's own, trusted."""
    cur = path
    for _ in range(_MAX_SYMLINKS):
        try:
            st = os.lstat(cur)
        except OSError:
            return True  # what it names is no path of the file system (a pipe, a socket): the kernel's own
        if not stat.S_ISLNK(st.st_mode):
            return True
        if not _trusted_owner(st.st_uid):
            return False
        cur = os.path.join(os.path.dirname(cur), os.readlink(cur))
    return False


def write_out(path: str | Path, data: bytes | str, *, what: str, mode: int = 0o600) -> None:
    """Write a file the operator names (``plan --out``). A path that is, or is a symlink of root's or the running
    user's to, a character device or a FIFO (``/dev/stdout`` on a terminal or a pipe, ``/dev/null``) is written
    to, never replaced: renaming over it would swap ``/dev/stdout`` for a regular file. Such a symlink to a regular
    file (``/dev/stdout`` redirected to a file) writes that file, safely. A block device, a socket or a directory is
    refused (``UnsafePath``, naming it); anything else, a missing path and a symlink another user planted included,
    goes through ``write_atomic`` (replaced, never followed)."""
    p = str(path)
    try:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            if not _links_trusted(p):
                write_atomic(p, data, mode=mode)
                return
            st = os.stat(p)
    except FileNotFoundError:  # nothing there, or a dangling symlink: made (or replaced) safely
        write_atomic(p, data, mode=mode)
        return
    if stat.S_ISREG(st.st_mode):
        write_atomic(os.path.realpath(p) if os.path.islink(p) else p, data, mode=mode)
        return
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        kind = (
            "a block device" if stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a socket"
        )
        raise UnsafePath(f"refusing {what} {p}: it is {kind}; name a file, or a terminal or pipe such as /dev/stdout")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(p, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)  # no O_CREAT, no O_TRUNC: written to, as it is
    try:
        now = os.fstat(fd)
        if not (stat.S_ISCHR(now.st_mode) or stat.S_ISFIFO(now.st_mode)):
            raise UnsafePath(f"refusing {what} {p}: it changed while it was opened; try again")
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_json(path: str | Path, *, what: str) -> Any:
    """A trusted JSON file's value (``read_trusted``); FileNotFoundError when missing, ValueError when not JSON."""
    return json.loads(read_trusted(path, what=what))


def open_append(path: str | Path, *, what: str) -> int:
    """An fd for appending to ``path`` (made 0600 when missing; readable too, for a look at its end), checked like
    ``open_trusted``. The caller closes it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"refusing {what} {path}: it is a symlink; replace it by the file itself") from None
        raise
    try:
        check_fd(fd, path, what=what)
    except BaseException:
        os.close(fd)
        raise
    return fd
