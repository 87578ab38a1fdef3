"""systemd's notify protocol for ``reconciler run`` (``Type=notify``, ``WatchdogSec=``), with the standard library.

The loop says ``READY=1`` once its first pass is done (so ``systemctl start`` returns when the host has been looked
at, and units ordered after it find the metrics served), ``STOPPING=1`` on its way out, and ``WATCHDOG=1`` while it
is well: its HTTP listener alive and no pass running longer than the longest one its recipes allow. A loop wedged
in a pass, or one that lost its listener for good, stops pinging and systemd restarts it.

Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable


def _address() -> str | None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]  # the abstract namespace
    return addr


def notify(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``WATCHDOG=1``, ``STATUS=…``) to systemd; False when there is no one to tell."""
    addr = _address()
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Half the watchdog timeout systemd gave this process (``$WATCHDOG_USEC``), or None without a watchdog."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


def start_watchdog(well: Callable[[], bool], stop: threading.Event) -> threading.Thread | None:
    """Ping ``WATCHDOG=1`` every half timeout while ``well()``; None without a watchdog."""
    interval = watchdog_interval()
    if interval is None:
        return None

    def run() -> None:
        while not stop.wait(interval):
            if well():
                notify("WATCHDOG=1")

    t = threading.Thread(target=run, name="sd-watchdog", daemon=True)
    t.start()
    return t
