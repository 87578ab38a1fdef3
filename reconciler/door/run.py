"""``reconciler door``: the front door as a process of its own (so a restart of the loop cuts no stream, and the
door's traffic never slows the loop's passes).

It looks at the host every ``LOOK_S`` through the service (``reconciler.service.door_view``: the desired state as the
loop reads it, each lane's health and sleep), hands each look to the app (``reconciler.door.app.Door``), publishes its
requests in flight per lane for the drain (``reconciler.store.door_state``) and serves the app with uvicorn. Off
loopback it needs its own token (``door-token`` in the host's state directory, made 0600 on first use, or
``--token-file``): a token of the door's alone, which can apply, reclaim or switch nothing anywhere else.
Called by ``reconciler.cli``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.base import fsafe
from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.door.app import Door
from reconciler.model import DoorConfig
from reconciler.service import Caller, HostService
from reconciler.service.door_view import DoorView, door_view
from reconciler.store.door_state import clear_door_state, write_door_state
from reconciler.store.state import checked_host_dir

LOOK_S = 0.2  # seconds between two looks at the host
DOOR_TOKEN_FILE = "door-token"


class DoorSetupError(ReconcilerError):
    code = "door_setup"


def is_loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def door_token(host: str, token_file: str | None) -> str:
    """The door's own token: ``token_file``, else ``door-token`` in the host's state directory (made 0600)."""
    path = Path(token_file) if token_file else checked_host_dir(host, create=True) / DOOR_TOKEN_FILE
    if not token_file and not path.exists():
        fsafe.write_atomic(path, secrets.token_urlsafe(32) + "\n")
    try:
        value = fsafe.read_trusted(path, what="the front door's token file", secret=True, limit=4096).decode().strip()
    except (OSError, fsafe.UnsafePath, UnicodeDecodeError) as exc:
        raise DoorSetupError(f"cannot use the front door's token file {path}: {exc}") from None
    if len(value) < 16 or any(c.isspace() for c in value):
        raise DoorSetupError(f"the front door's token file {path}: a token needs 16 printable characters, no spaces")
    return value


class Looker:
    """The door's look at the host, made in a thread (the service's reads block) and handed to the app."""

    def __init__(self, service: HostService, door: Door, host: str):
        self.service = service
        self.door = door
        self.host = host
        self.last_error = ""
        self.at = 0.0  # the wall clock at the start of the last look applied (status shows it)
        self.looked = 0.0  # the same on CLOCK_MONOTONIC (the drain compares it with its own start)
        self.lock = threading.Lock()  # one write at a time, so an older snapshot never lands after a newer one

    def look(self) -> tuple[float, float, DoorView | None]:
        """(when this look began on the wall clock, for ``status``, and on CLOCK_MONOTONIC, for the drain; what it
        saw, None when the files do not load). Made in a thread: the door's ``at`` and ``looked`` are set on the
        event loop once the view is applied (``forever``), never here, so what the door publishes as seen since then
        is what its routes act on."""
        at, looked = time.time(), time.monotonic()
        try:
            return at, looked, door_view(self.service.context)
        except ConfigError as exc:
            self.last_error = str(exc)
            return at, looked, None

    def snapshot(self) -> dict[str, Any]:
        """What the door publishes, taken on the event loop (where its counts and queues change)."""
        lanes: dict[str, Any] = {}
        view = self.door.view
        for recipe in {*self.door.in_flight, *(view.lanes if view else {})}:
            lanes[recipe] = {"in_flight": self.door.in_flight.get(recipe, 0), "admitting": self.door.admitting(recipe)}
        return {"at": self.at, "looked": self.looked, "lanes": lanes, "models": self.door.models_now()}

    def write(self, data: dict[str, Any]) -> None:
        try:
            with self.lock:
                write_door_state(self.host, data)
        except (OSError, fsafe.UnsafePath, ReconcilerError) as exc:
            # The drain then sees no door and waits for none of its requests: said on stderr, once per cause.
            if str(exc) != self.last_error:
                self.last_error = str(exc)
                print(f"reconciler door: cannot publish its requests in flight: {exc}", file=sys.stderr)

    async def forever(self) -> None:
        while True:
            at, looked, view = await asyncio.to_thread(self.look)
            if view is not None:
                self.door.apply_view(view)
                self.at, self.looked = at, looked  # from now on the routes act on a view at least as new as this
                await self.door.demand_step(self.service.switch)
            self.door.metrics.oldest.set(self.door.holds.oldest_s())
            await asyncio.to_thread(self.write, self.snapshot())
            await asyncio.sleep(LOOK_S)


def serve(root: str, *, listen: str | None = None, token_file: str | None = None) -> int:
    import uvicorn  # start-up: only the door serves

    service = HostService(root, caller=Caller("door", "door"))
    host = service.host()
    config: DoorConfig = host.door
    addr = listen or config.listen
    token = None if is_loopback(addr) and not token_file else door_token(host.name, token_file)
    door = Door(config, token=token)
    door.metrics.hold_s.set(config.hold_s)
    looker = Looker(service, door, host.name)
    door.publish = lambda: looker.write(looker.snapshot())
    app = door.app()
    bind, _, port = addr.rpartition(":")

    async def main() -> None:
        task = asyncio.create_task(looker.forever())
        try:
            server = uvicorn.Server(
                uvicorn.Config(app, host=bind.strip("[]"), port=int(port), log_level="warning", access_log=False)
            )
            await server.serve()
        finally:
            task.cancel()
            clear_door_state(host.name)

    # uvicorn takes SIGTERM while it serves and raises it again once it has stopped: with this handler in place
    # then, the door leaves through main()'s clean-up (its published state removed) and exits 0, as systemd expects.
    signal.signal(signal.SIGTERM, _leave_on_term)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())
    return 0


def _leave_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency on Linux and macOS): every token of every stream
    passes the door's event loop."""
    try:
        import uvloop  # start-up: only the door serves
    except ImportError:
        return None
    return uvloop.new_event_loop
