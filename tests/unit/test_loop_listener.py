"""The pure parts of proving a listener the loop's (reconciler/observe/loop_listener.py) and of saying a front-end's
state to systemd (reconciler/loop/hosting.py): which listening sockets a connection may land on, which socket is
the far end of a connection, and the STATUS line of a listener that is not bound."""

from __future__ import annotations

from reconciler.loop.hosting import status_line
from reconciler.observe.loop_listener import _far_end, listening_on
from reconciler.observe.net import TCP_LISTEN, TcpSocket


def sock(address: str, port: int, state: int = TCP_LISTEN, remote: tuple[str, int] = ("0.0.0.0", 0)) -> TcpSocket:
    return TcpSocket(address, port, remote[0], remote[1], state, 65534, 7)


def test_a_connection_may_land_on_its_own_address_or_a_wildcard_and_nowhere_else() -> None:
    table = [
        sock("127.0.0.1", 9464),
        sock("0.0.0.0", 9464),
        sock("::", 9464),
        sock("::ffff:127.0.0.1", 9464),
        sock("127.0.0.2", 9464),
        sock("127.0.0.1", 9465),
        sock("127.0.0.1", 9464, state=0x01),
    ]
    got = listening_on(table, "127.0.0.1", 9464)
    assert [s.address for s in got] == ["127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"]
    assert [s.address for s in listening_on(table, "::1", 9464)] == ["0.0.0.0", "::"]


def test_the_far_end_of_a_connection_is_matched_by_both_ends_whatever_the_family() -> None:
    far = sock("::ffff:127.0.0.1", 9464, state=0x01, remote=("::ffff:127.0.0.1", 40000))
    table = [sock("127.0.0.1", 9464), sock("127.0.0.1", 9464, state=0x01, remote=("127.0.0.1", 40001)), far]
    assert _far_end(table, ("127.0.0.1", 40000), ("127.0.0.1", 9464)) is far
    assert _far_end(table, ("127.0.0.1", 40002), ("127.0.0.1", 9464)) is None


def test_the_status_line_says_the_listener_is_not_bound_and_who_holds_it() -> None:
    line = status_line(
        "listener",
        {
            "addr": "127.0.0.1:9464",
            "bound": False,
            "error": "Address already in use",
            "holder": "pid 4242 (python3, uid 65534 (nobody)) on 127.0.0.1:9464",
            "retry_in_s": 8.0,
        },
    )
    assert line == (
        "listener 127.0.0.1:9464 not bound (Address already in use; held by pid 4242 (python3, uid 65534 (nobody)) "
        "on 127.0.0.1:9464); reconciling without it, binding again in 8.0 s"
    )
    assert status_line("listener", {"addr": "127.0.0.1:9464", "bound": True}) == "listener 127.0.0.1:9464 serving"
