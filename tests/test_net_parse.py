"""The listening sockets of /proc/net/tcp and tcp6 (captured text in tests/data/net) and the socket links of
/proc/PID/fd, parsed; and the read of both against a real socket of this process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from reconciler.observe.net import (
    TcpListener,
    parse_proc_net_tcp,
    parse_socket_link,
    read_tcp_listeners,
    socket_holders,
)

DATA = Path(__file__).resolve().parent / "data" / "net"


def test_the_listening_ipv4_sockets_are_read_with_their_address_port_owner_and_inode() -> None:
    got = parse_proc_net_tcp((DATA / "tcp").read_text())
    assert got == [
        TcpListener("0.0.0.0", 8001, 0, 241001),
        TcpListener("127.0.0.1", 37567, 65534, 494486),
        TcpListener("127.0.0.1", 631, 104, 18244),
    ]  # the established connection (state 01) is no listener
    assert got[1].where == "127.0.0.1:37567"


def test_the_listening_ipv6_sockets_are_read_in_the_kernels_word_order() -> None:
    got = parse_proc_net_tcp((DATA / "tcp6").read_text())
    assert got == [TcpListener("::", 8080, 0, 33017), TcpListener("::1", 9000, 1000, 33018)]
    assert got[1].where == "[::1]:9000"


def test_a_line_that_does_not_parse_is_skipped() -> None:
    text = (DATA / "tcp").read_text().splitlines()
    broken = "\n".join([text[0], "   9: zz:1F41 00000000:0000 0A x", "garbage", text[1]])
    assert parse_proc_net_tcp(broken) == [TcpListener("0.0.0.0", 8001, 0, 241001)]
    assert parse_proc_net_tcp("") == []


def test_a_socket_link_gives_its_inode_and_anything_else_none() -> None:
    assert parse_socket_link("socket:[494486]") == 494486
    assert parse_socket_link("/dev/shm/vllm_offload_x.mmap") is None
    assert parse_socket_link("pipe:[123]") is None
    assert parse_socket_link("anon_inode:[eventfd]") is None


def test_a_real_listener_of_this_process_is_found_and_held_by_this_pid() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        [mine] = [s for s in read_tcp_listeners() if s.port == port]
        assert mine.address == "127.0.0.1" and mine.uid == os.geteuid()
        assert mine.inode == os.fstat(srv.fileno()).st_ino
        assert socket_holders([mine.inode]) == {mine.inode: {os.getpid()}}
    assert not [s for s in read_tcp_listeners() if s.port == port], "closed: no longer listed"
    assert socket_holders([]) == {}
