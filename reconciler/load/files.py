"""Reading the operator's files safely: where they lie under the root, the root checked like the tool's own
files, and each file's text (a regular file of UTF-8 text, bounded in size, on a trusted path).

Called by the readers of each kind of file (``reconciler.load.yaml_source``, ``.recipes``, ``.host_file``,
``.desired``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TypeVar

from reconciler.base import fsafe
from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.base.units import human_bytes

HOST_FILE = "configs/host.yaml"
RECIPES_DIR = "configs/recipes"
MANIFESTS_DIR = "manifests"
MAX_FILE_BYTES = 1 << 20  # an operator's file is a few KiB; anything near this is not one


def rel_path(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def read_text(root: Path, path: Path, what: str) -> str:
    """The file's text: a regular file of UTF-8 text, at most MAX_FILE_BYTES; else a ConfigError naming it.

    Opened without blocking and checked with fstat before reading, so a FIFO, a device (a symlink to /dev/zero)
    or a directory is refused instead of hanging or filling memory."""
    rel = rel_path(root, path)
    try:
        fsafe.check_trusted(path, what=what, last=None)  # the way to it; the file itself on the open descriptor
    except fsafe.UnsafePath as exc:
        raise ConfigError([ConfigProblem(rel, None, str(exc))]) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError([ConfigProblem(rel, None, "file not found")]) from None
    except OSError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"cannot read {what}: {exc.strerror or exc}")]) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ConfigError([ConfigProblem(rel, None, f"{what} is {kind}; it must be a regular file of text")])
        fsafe.check_owner(st, path, what=what)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except fsafe.UnsafePath as exc:
        raise ConfigError([ConfigProblem(rel, None, str(exc))]) from None
    except OSError as exc:
        raise ConfigError([ConfigProblem(rel, None, f"cannot read {what}: {exc.strerror or exc}")]) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(
            [ConfigProblem(rel, None, f"{what} is larger than {human_bytes(MAX_FILE_BYTES)}; is this the right file?")]
        )
    nul = data.find(b"\x00")
    if nul >= 0:
        line, col = line_col(data, nul)
        raise ConfigError(
            [
                ConfigProblem(
                    rel,
                    line,
                    f"a NUL byte at column {col}: this is a binary file, not {what} in UTF-8 text. "
                    "Restore the text (was it saved as UTF-16, or overwritten?)",
                )
            ]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = line_col(data, exc.start)
        raise ConfigError(
            [
                ConfigProblem(
                    rel,
                    line,
                    f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {col} ({exc.reason}). Save it as UTF-8 "
                    "(was it written in Latin-1 or a Windows code page?)",
                )
            ]
        ) from None
    return text.removeprefix("\ufeff")


# ---------------------------------------------------------------- the root itself


def check_root(r: Path) -> None:
    """The root and its directories checked like the tool's own files (docs/design.md, safety rule 12) before
    anything is read from them: owned by root (or the running user) and not writable by group or others, along
    their whole real path. A ConfigError naming the first that is not, and the fix. A root that is no directory at
    all is said so first, alone: its missing files would only repeat it."""
    if not r.is_dir():
        why = "no such directory" if not r.exists() else "not a directory"
        raise ConfigError(
            [
                ConfigProblem(
                    str(r),
                    None,
                    f"{why}: give --root (or $RECONCILER_ROOT) the directory holding configs/ and manifests/",
                )
            ]
        )
    for rel, what in (
        (".", "--root"),
        ("configs", "the configs directory"),
        (RECIPES_DIR, "the recipes directory"),
        (MANIFESTS_DIR, "the manifests directory"),
    ):
        path = r if rel == "." else r / rel
        try:
            fsafe.check_trusted(path, what=what)
        except fsafe.UnsafePath as exc:
            raise ConfigError([ConfigProblem(str(r) if rel == "." else rel, None, str(exc))]) from None


# The loop loads every file at every pass, and a file rarely changes between two: the parse of a YAML text (the
# pure-Python composer, about 7 ms for the host file) and the validated recipe of a TOML text (tomllib, about 2 ms)
# are kept for the text they came from. Only texts that parsed are kept, so an error is reported afresh every time;
# nothing kept is ever mutated (the models are frozen and built from the parsed values).
_V = TypeVar("_V")
_KEEP = 64


def remember(cache: dict[str, _V], text: str, value: _V) -> None:
    if len(cache) >= _KEEP:
        cache.pop(next(iter(cache)))
    cache[text] = value
