"""Who a peer of the listener is (``reconciler.api.peers.peer_of``): the ``sock_diag`` request and answer, and a real
loopback connection from another address than 127.0.0.1, found by netlink and through /proc/net/tcp (whose parse,
on captured text, is tests/real/test_net_parse.py's)."""

from __future__ import annotations

import os
import socket
import struct

from reconciler.api.peers import diag_owner, diag_request, peer_of


def test_the_sock_diag_request_and_answer() -> None:
    req = diag_request(("127.0.0.5", 40000), ("127.0.0.1", 9464))
    assert req is not None and len(req) == struct.unpack_from("=I", req)[0] == 72
    assert diag_request(("127.0.0.5", 1), ("::1", 2)) is None
    msg = bytes(64) + struct.pack("=II", 65534, 81301)
    assert diag_owner(struct.pack("=IHHII", 16 + len(msg), 20, 0, 1, 0) + msg) == 65534
    gone = bytes(64) + struct.pack("=II", 0, 0)
    assert diag_owner(struct.pack("=IHHII", 16 + len(gone), 20, 0, 1, 0) + gone) is None
    assert diag_owner(struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -2) + bytes(16)) is None


def test_a_loopback_peer_is_its_user_whichever_address_it_uses() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        for addr in ("127.0.0.1", "127.0.0.9"):
            with socket.socket() as c:
                c.bind((addr, 0))
                c.connect(listener.getsockname())
                s, _ = listener.accept()
                with s:
                    want = f"uid {os.geteuid()}"
                    assert peer_of(s.getpeername(), s.getsockname()) == want
                    assert peer_of(s.getpeername(), s.getsockname(), diag=None) == want  # through /proc/net/tcp
    assert peer_of(("203.0.113.7", 5), ("127.0.0.1", 80)) == "203.0.113.7"
    assert peer_of(("2001:db8:1:2::9", 5), ("::1", 80)) == "2001:db8:1:2::/64"
