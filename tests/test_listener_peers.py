"""Who a peer of the listener is (``reconciler.api.peer_of``): the parse of ``/proc/net/tcp`` text captured on this
project's machines, the ``sock_diag`` answer, and a real loopback connection from another address than 127.0.0.1."""

from __future__ import annotations

import os
import socket
import struct

from reconciler.api import diag_owner, diag_request, peer_of, socket_owner, tcp_endpoints

TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 81234 1 0 100 0 0 10 0
   1: 0500007F:D431 0100007F:9C41 01 00000000:00000000 00:00000000 00000000 65534        0 81301 1 0 20 4 30 10 -1
   2: 0600007F:D432 0100007F:9C41 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0
"""


def test_the_client_end_names_its_owner_and_a_socket_no_one_holds_names_no_one() -> None:
    [(table, local)] = tcp_endpoints("127.0.0.5", 0xD431)
    assert (table, local) == ("tcp", "0500007F:D431")  # little-endian words, as the kernel writes them here
    [(_, server)] = tcp_endpoints("127.0.0.1", 0x9C41)
    assert socket_owner(TABLE, local, server) == 65534
    assert socket_owner(TABLE, "0600007F:D432", server) is None  # TIME_WAIT: inode 0, its uid root's
    assert socket_owner(TABLE, "0700007F:D433", server) is None
    assert [t for t, _ in tcp_endpoints("::ffff:127.0.0.1", 80)] == ["tcp", "tcp6"]


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
