"""What the command line accepts from the loop's socket (``reconciler.control.protocol._FRAMES``), checked frame by
frame without a loop: each kind with its keys, types and ranges, and everything else refused as garbled. The real
socket, a planted fake loop and a real ``reconciler`` process are in tests/attack/test_control_trust.py."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from reconciler.control.protocol import _MAX_FRAME, _MAX_LINE, _decode, _frame, _Garbled, _Reader

GOOD = [
    (b'{"accepted": true}\n', "accepted"),
    (b'{"other": "this loop runs for /srv/root"}\n', "other"),
    (b'{"busy": "32 commands in progress"}\n', "busy"),
    (b'{"out": 0}\n', "out"),
    (b'{"err": %d}\n' % _MAX_FRAME, "err"),
    (b'{"ask": "Apply 1 action(s)? [y/N] "}\n', "ask"),
    (b'{"wait": true}\n', "wait"),
    (b'{"read": "p.plan", "what": "the plan file"}\n', "read"),
    (b'{"write": "p.plan", "size": 12}\n', "write"),
    (b'{"exit": 0}\n', "exit"),
    (b'{"exit": 255}\n', "exit"),
]

BAD = [
    b'{"exit": "x"}\n',
    b'{"exit": null}\n',
    b'{"exit": 256}\n',
    b'{"exit": -1}\n',
    b'{"exit": true}\n',
    b'{"exit": 1.0}\n',
    b'{"exit": 1e999}\n',
    b'{"exit": NaN}\n',
    b'{"exit": Infinity}\n',
    b'{"exit": 0, "out": 1}\n',
    b'{"exit": 0, "extra": 1}\n',
    b'{"out": -1}\n',
    b'{"out": %d}\n' % (_MAX_FRAME + 1),
    b'{"ask": 5}\n',
    b'{"ask": "%s"}\n' % (b"x" * 5000),
    b'{"accepted": 1}\n',
    b'{"read": "p.plan"}\n',
    b'{"write": "p.plan", "size": "12"}\n',
    b"{}\n",
    b'{"launch": true}\n',
    b"null\n",
    b"1e999\n",
    b"[1]\n",
    b'"exit"\n',
    b"\xff\xfe\n",
    b"[" * 100_000 + b"\n",
    b'{"exit": ' + b"9" * 5000 + b"}\n",
]


@pytest.mark.parametrize(("line", "kind"), GOOD)
def test_each_kind_of_frame_is_taken(line: bytes, kind: str) -> None:
    assert _frame(_decode(line)) == kind


@pytest.mark.parametrize("line", BAD, ids=lambda b: repr(b[:30]))
def test_anything_else_is_garbled(line: bytes) -> None:
    with pytest.raises(_Garbled):
        _frame(_decode(line))


def test_a_line_too_long_or_cut_short_is_garbled_and_a_silent_end_is_not() -> None:
    for data, want in ((b"x" * (_MAX_LINE + 10), "a line over"), (b'{"exi', "cut short")):
        a, b = socket.socketpair()
        with a, b:

            def send(b: socket.socket = b, data: bytes = data) -> None:
                with contextlib.suppress(OSError):  # the reader stops reading at the bound
                    b.sendall(data)
                    b.shutdown(socket.SHUT_WR)

            sender = threading.Thread(target=send)
            sender.start()
            with pytest.raises(_Garbled, match=want):
                _Reader(a).line(None)
            a.shutdown(socket.SHUT_RD)
            a.close()
            sender.join()
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b'{"out": 10}\nabc')
        b.shutdown(socket.SHUT_WR)
        r = _Reader(a)
        assert r.line(None) == b'{"out": 10}\n'
        with pytest.raises(_Garbled, match="cut short"):
            r.exact(10, None)
    a, b = socket.socketpair()
    with a, b:
        b.close()
        assert _Reader(a).line(None) is None  # closed without a word: no line, not garbage


def test_a_silent_socket_meets_the_deadline() -> None:
    import time

    a, b = socket.socketpair()
    with a, b:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            _Reader(a).line(time.monotonic() + 0.2)
        assert 0.15 < time.monotonic() - t0 < 2
