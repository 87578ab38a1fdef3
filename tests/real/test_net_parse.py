"""The TCP sockets of /proc/net/tcp and tcp6 (captured text in tests/data/net) and the socket links of
/proc/PID/fd, parsed (``reconciler.observe.net``, the one reader every caller shares: the planner's listeners, the
apply layer's port proof, the HTTP listener's peer lookup); and the read of both against real sockets of this
process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from reconciler.observe.listeners import read_listeners
from reconciler.observe.net import (
    TcpListener,
    parse_proc_net_tcp,
    parse_socket_link,
    parse_tcp_sockets,
    read_tcp_listeners,
    read_tcp_sockets,
    socket_holders,
    socket_owner,
)
from reconciler.plan.observed import Listener

DATA = Path(__file__).resolve().parents[1] / "data" / "net"


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


def test_a_v4_mapped_listener_reads_as_the_ipv4_address_it_stands_for() -> None:
    v4 = [(x.address, x.port, x.inode) for x in parse_proc_net_tcp((DATA / "tcp-mapped").read_text())]
    assert v4 == [("0.0.0.0", 2024, 580), ("127.0.0.1", 8000, 9001)], "the TIME_WAIT socket is no listener"
    v6 = [(x.address, x.port, x.inode) for x in parse_proc_net_tcp((DATA / "tcp6-mapped").read_text())]
    assert v6 == [("::", 8001, 9002), ("::ffff:127.0.0.1", 8002, 9003)]
    found = [Listener(address=a, port=p, inode=i) for a, p, i in v4 + v6]
    assert all(x.reachable_from_loopback for x in found)


def test_a_line_that_does_not_parse_is_skipped() -> None:
    text = (DATA / "tcp").read_text().splitlines()
    broken = "\n".join([text[0], "   9: zz:1F41 00000000:0000 0A x", "garbage", text[1]])
    assert parse_proc_net_tcp(broken) == [TcpListener("0.0.0.0", 8001, 0, 241001)]
    assert parse_proc_net_tcp("") == []


def test_every_socket_is_read_with_both_ends_its_state_and_owner() -> None:
    [*_, established, _] = parse_tcp_sockets((DATA / "tcp").read_text())
    assert (established.address, established.port, established.remote_address, established.remote_port) == (
        "127.0.0.1",
        8001,
        "127.0.0.1",
        50000,
    )
    assert (established.state, established.uid, established.inode) == (0x01, 0, 512345)
    mapped = parse_tcp_sockets((DATA / "tcp6").read_text())[2]
    assert (mapped.address, mapped.remote_address, mapped.remote_port) == (
        "::ffff:127.0.0.1",
        "::ffff:127.0.0.1",
        54321,
    )


def test_the_client_end_of_a_connection_names_its_owner_and_a_socket_no_one_holds_names_no_one() -> None:
    table = parse_tcp_sockets((DATA / "tcp-peers").read_text())
    server = ("127.0.0.1", 0x9C41)
    assert socket_owner(table, ("127.0.0.5", 0xD431), server) == 65534
    assert socket_owner(table, ("::ffff:127.0.0.5", 0xD431), ("::ffff:127.0.0.1", 0x9C41)) == 65534, "v4-mapped"
    assert socket_owner(table, ("127.0.0.6", 0xD432), server) is None  # TIME_WAIT: inode 0, its uid root's
    assert socket_owner(table, ("127.0.0.7", 0xD433), server) is None
    assert socket_owner(table, ("127.0.0.5", 0xD431), ("127.0.0.1", 1)) is None, "another server port"
    assert socket_owner(table, ("no address", 1), server) is None
    on_port = parse_tcp_sockets((DATA / "tcp-peers").read_text(), local_port=0xD431)
    assert [(x.address, x.port, x.uid) for x in on_port] == [("127.0.0.5", 0xD431, 65534)], "the others not parsed"
    assert parse_tcp_sockets((DATA / "tcp-peers").read_text(), local_port=0x9C41)[0].inode == 81234, "not the remote"


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
        assert socket_holders([mine.inode], every=False) == {mine.inode: {os.getpid()}}
        looked_up, found = read_listeners([port], known_containers=frozenset())
        assert port in looked_up
        assert [(x.port, x.inode, x.pid) for x in found] == [(port, mine.inode, os.getpid())]
        with socket.create_connection(("127.0.0.1", port)) as client:
            here = client.getsockname()
            assert socket_owner(read_tcp_sockets(), here, ("127.0.0.1", port)) == os.geteuid()
            assert socket_owner(read_tcp_sockets(local_port=here[1]), here, ("127.0.0.1", port)) == os.geteuid()
    assert not [s for s in read_tcp_listeners() if s.port == port], "closed: no longer listed"
    assert socket_holders([]) == {}
