"""The one boundary of the text a command prints (``Terminal``), the redacting JSON writer (``emit_json``) and the
error a command ends with (``print_error``): standard library and ``reconciler.base`` only, so the command line's
client of a running loop (``reconciler.control.client``) prints its errors as the command line does without
importing it. Used by ``reconciler.cli`` and its modules, and by ``reconciler.control.client``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO, cast

from reconciler.base.units import terminal_text


class Terminal:
    """The one boundary of text a command prints: every write is redacted (``reconciler.base.redact.redact_output``: URL
    passwords, the secret values this process learned) and its control characters are shown escaped
    (``reconciler.base.units.terminal_text``: a file name or a container's log line with ESC or U+009B cannot drive the
    terminal), the tool's own colour and redraw sequences kept. JSON goes out through ``write_json`` as it is: it
    was redacted whole by ``redact_json``, and JSON escapes every control character itself."""

    __slots__ = ("stream",)

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        # Redact's patterns cost some 15 ms of a command the loop answers, whose client prints through here only when
        # it fails: imported on the first write, for the start-up budget.
        from reconciler.base.redact import redact_output

        self.stream.write(terminal_text(redact_output(text)))
        return len(text)

    def write_json(self, text: str) -> int:
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def terminal(stream: TextIO) -> TextIO:
    """``stream`` behind the terminal boundary (once: a stream already behind it is returned as it is)."""
    return stream if isinstance(stream, Terminal) else cast("TextIO", Terminal(stream))


def shell_word(word: str) -> str:
    """``word`` as one word a shell reads back exactly, on one printable line: for the commands the tool suggests be
    copied and pasted. A printable word is quoted as POSIX sh quotes it (``shlex.quote``); any other (a file name
    with a newline, a tab, an ESC, a byte that is not UTF-8) is written in ``$'...'`` (bash, zsh, ksh), every byte
    outside printable ASCII as ``\\xHH``: the terminal boundary would show such a character escaped inside plain
    quotes, which a shell then reads as other characters, another file's name, and a raw newline would end the line
    and let the name print lines that look like the tool's own."""
    if word.isprintable():
        import shlex  # the start-up budget: only a command that suggests another quotes words

        return shlex.quote(word)
    out = []
    for b in os.fsencode(word):
        if b in (0x27, 0x5C):  # ' and \
            out.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def emit_json(data: Any, out: TextIO | None = None) -> None:
    from reconciler.base.redact import redact_json  # the start-up budget, as in Terminal.write

    # A last pass over every string on its way out: a command line missed at its source is masked here.
    out = out or sys.stdout
    getattr(out, "write_json", out.write)(redact_json(data, indent=2, sort_keys=False, default=str) + "\n")


def print_error(code: str, message: str, *, out: TextIO, err: TextIO, as_json: bool) -> None:
    """An error that ends a command: on ``err``, and with ``as_json`` also as ``{"error": {"code", "message"}}`` on
    ``out``, so a program reading stdout always gets a JSON answer that says what went wrong."""
    print(f"error: {message}" if code != "interrupted" else message, file=terminal(err))
    if as_json:
        emit_json({"error": {"code": code, "message": message}}, terminal(out))
