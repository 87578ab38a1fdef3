"""The front door before the simulated host's lanes (docs/design.md, the front door; the simulation's invariants (l)
and (m)).

``SimDoor`` is the project's own ``reconciler.door.app.Door``, driven as ``reconciler door`` drives it, on the world's
clock: its looks at the host are ``reconciler.service.door_view.door_view`` over the world's lanes (their health and
``GET /is_sleeping``), handed to ``Door.apply_view``; a client's request is the door's own ``openai`` route, given a
Starlette request in process (held by its real ``Holds``, released by a look, refused by its real rules), and sent
through its upstream session, here the world's lane on that port (``_Lanes``: streaming, cut when the lane goes away,
a refused connection where nothing listens); the demand policy's turn is ``Door.demand_step`` with the service's own
switch, audited with the door as its caller. What it has in flight per lane is published through
``reconciler.store.door_state`` as the door publishes it, and the drain reads it through ``HostIO.lanes.front``
(``seams.sim_io``). The door's event loop keeps the world's monotonic clock (``VirtualLoop``): ``door.hold_s`` and
the streams' pace run on it, and it is run only until nothing more is ready, never waiting in real time.

The door looks every ``every`` seconds of the world's clock: while the tool waits (``World.on_sleep``: during a pass,
so a drain sees it look, as it does on a real host) and before each of its own steps between the loop's passes.

Invariants, judged by the world's truth at the moment they could break:
(l) a request is forwarded only to a lane that is then healthy and awake (ours, booted, not asleep or half woken) and
    not being drained: a lane whose drain began before the door's last look, or that was not serving at that look,
    is never sent one; a lane that changed since the door last looked (it died, it restarted) is the world's doing,
    and a send that finds nothing listening reaches no lane (the door holds the request again);
(m) the demand policy never switches the host to a topology that it could know is blocked (a look that found it
    running saw the loop's last pass, made under it, blocked, and no look since saw one of it unblocked), and never
    within ``demand.min_dwell_s`` of the world's monotonic clock of the running topology's start as the door first
    saw it or of its own last switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from sim.world import Container, World

# What the doors of this process did, all runs together (how much of the door a budget of steps reached).
SEEN: Counter[str] = Counter()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on the world's monotonic clock, run only while something is ready (``settle``): a timer falls
    due when the world's clock passes it, and nothing waits in real time."""

    def __init__(self, now: Callable[[], float]):
        super().__init__()
        self._now = now
        # A timer falls due within this of its time: the world's clock counts from 1.8e9 s, where a float's step is
        # some 2e-7 s, so the monotonic clock's own resolution (1e-9) would leave a timer due now unfired.
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self._now()

    def settle(self) -> None:
        for _ in range(100_000):
            self.call_soon(self.stop)
            self.run_forever()
            due = self._scheduled and self._scheduled[0]._when < self.time() + self._clock_resolution
            if not self._ready and not due:
                return
        raise RuntimeError(f"simulation: the door's event loop never settles: {list(self._ready)[:3]}")


class _LaneAnswer:
    """A lane's streamed answer, shaped as the door reads an ``aiohttp.ClientResponse`` (``status``, ``headers``,
    ``content.iter_any()``, ``release``, ``close``): a first chunk, then ``[DONE]`` once ``seconds`` of the world's
    clock have passed, or a payload error as soon as the lane goes away (stopped, asleep, restarted: its connection is
    cut)."""

    def __init__(self, world: World, lane: Container, seconds: float, status: int = 200):
        self.world = world
        self.lane = lane
        self.status = status
        self.headers = {"content-type": "text/event-stream" if status == 200 else "application/json"}
        self.end = world.now + seconds
        self.restarts = lane.restarts
        self.gone = asyncio.Event()
        self.content = self

    def gone_now(self) -> bool:
        c = self.lane
        return c.state != "running" or c.sleep_state != "awake" or c.restarts != self.restarts

    async def iter_any(self) -> AsyncIterator[bytes]:
        if self.status != 200:
            yield b'{"error": "The engine is sleeping"}'
            return
        yield b'data: {"choices":[{"delta":{"content":"ready"}}]}\n\n'
        if self.world.now < self.end:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.gone.wait(), timeout=self.end - self.world.now)
        if self.gone.is_set() or self.gone_now():
            raise aiohttp.ClientPayloadError("the lane's connection was cut (simulated)")
        yield b"data: [DONE]\n\n"

    def release(self) -> None:
        self.gone.set()

    def close(self) -> None:
        self.gone.set()


class _Lanes:
    """The door's upstream session (``Door.session``, an ``aiohttp.ClientSession`` on a host): each request goes to
    the world's lane on its URL's port."""

    def __init__(self, door: SimDoor):
        self.door = door

    async def request(self, method: str, url: str, *, data: bytes, headers: dict[str, str]) -> _LaneAnswer:
        return self.door.lane_answers(urlsplit(url).port, data, headers)


class SimDoor:
    """The door of one simulated host (``world.door`` once made)."""

    def __init__(
        self,
        world: World,
        root: Path,
        *,
        every: float,
        hold_s: float,
        max_queue: int,
        on_switch: Callable[[str], None] = lambda to: None,
    ):
        from reconciler.base.clock import Clock
        from reconciler.door.app import Door
        from reconciler.model import DoorConfig

        self.world = world
        self.root = root
        self.every = every
        self.on_switch = on_switch
        self.loop = VirtualLoop(lambda: world.now)
        self.door = Door(
            DoorConfig(hold_s=hold_s, max_queue=max_queue),
            publish=self.publish,
            clock=Clock(time=world.wall, monotonic=lambda: world.now, sleep=world.sleep),
        )
        self.door.session = _Lanes(self)  # type: ignore[assignment]
        self.at = -math.inf  # the wall clock at its last look (what it publishes for the drain)
        self.looked = -math.inf  # the monotonic clock at its last look
        self.applied = -math.inf  # the same at its last look whose view it applied (what it publishes as "looked")
        self._desired: tuple[Any, Any] = (None, None)  # (the files' bytes, the desired state loaded from them)
        self.clients: list[asyncio.Task[None]] = []
        self.gone_clients: dict[asyncio.Task[None], asyncio.Event] = {}  # set when its client goes away
        self.streams: list[_LaneAnswer] = []
        self.answers: Counter[str] = Counter()  # status (and "cut" for a stream ended by its error event)
        self.forwarded = 0
        self.excused = 0  # forwards to a lane that changed since the door's last look (the world's doing)
        self.refused = 0  # sends that found nothing listening on the lane's port (the door holds them again)
        self.switches: list[tuple[float, str, str]] = []  # (world.now, from, to) of each demand switch made
        self.later: list[list[Any]] = []  # arrivals due after a number of the tool's waits: [waits left, args]
        self.busy = False
        self._ids = itertools.count(1)
        # The world's truth the judges keep: per lane port (container id, serving) at the last look; per container the
        # wall clock its drain began; per pass the loop made, its topology and its blocker; what a look could know.
        self.truth: dict[int, tuple[str | None, bool]] = {}
        # container id -> (the monotonic clock its drain began at, as the drain and the door's published look count
        # time; sleep calls made before; its restarts then)
        self.draining: dict[str, tuple[float, int, int]] = {}
        self.passes: dict[float, tuple[str | None, str]] = {}
        self.known_blocked: dict[str, str] = {}
        self.seen: tuple[str | None, float] = (None, world.now)  # the running topology a look first saw, and when
        world.door = self
        world.on_sleep.append(self._waited)

    # ------------------------------------------------------------ the door's process, on the world's clock

    def _service(self) -> Any:
        from reconciler.service import Caller, HostService

        return HostService(str(self.root), caller=Caller("door", "door"), io=self.world.io)

    def _files(self) -> bytes:
        """What the desired state is loaded from (a commit of the git source is exported under the state directory:
        the loader's own record of it names it)."""
        from reconciler.store.source import read_source_record

        parts = [p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()]
        parts.append(str(read_source_record(self.world.host_name).commit).encode())  # None without a source
        return b"\0".join(parts)

    def _view(self) -> Any:
        """``door_view`` as ``reconciler door`` takes it, the desired state loaded again only when its files changed
        (a load per look would be most of the run's time); None when the files do not load."""
        from reconciler.base.errors import ConfigError
        from reconciler.service.door_view import door_view

        key = self._files()
        if key != self._desired[0]:
            try:
                self._desired = (key, self._service().desired())
            except ConfigError:
                self._desired = (key, None)
        desired = self._desired[1]
        if desired is None:
            return None
        return door_view(_Looked(desired, self.world.io))

    def look(self, *, demand: bool = False) -> None:
        """One look at the host (``reconciler.door.run.Looker``'s turn): the view handed to the door, what it has in
        flight published; with ``demand``, then the demand policy's turn."""
        if self.busy:
            return
        self.busy = True
        try:
            at, now = self.world.wall(), self.world.now
            view = self._view()
            if view is not None:
                self.at, self.looked, self.applied = at, now, now
                self._saw(view)
                self.door.apply_view(view)
                self.settle()
                if demand:
                    self.loop.run_until_complete(self.door.demand_step(self._switch))
                    self.settle()
            else:
                self.looked = now
            self.publish()
        finally:
            self.busy = False

    def tick(self, *, demand: bool = True) -> None:
        """The door runs beside the tool: a look when ``every`` has passed since its last, and after it the demand
        policy's turn (``demand``: between the loop's passes; during one the door only looks)."""
        if self.world.now - self.looked >= self.every:
            self.look(demand=demand)
        else:
            self.settle()

    def _waited(self, world: World) -> None:
        """One of the tool's waits (``World.on_sleep``): the door looks meanwhile, and clients due now arrive."""
        if self.busy:
            return
        self.tick(demand=False)
        due = [a for a in self.later if a[0] <= 0]
        for a in self.later:
            a[0] -= 1
        self.later = [a for a in self.later if a[0] > -1]
        for _, args in due:
            self.ask(*args, demand=False)

    def settle(self) -> None:
        for s in self.streams:
            if s.gone_now():
                s.gone.set()
        self.loop.settle()
        self.streams = [s for s in self.streams if not s.gone.is_set() and self.world.now < s.end]

    def publish(self) -> None:
        """What ``reconciler door`` publishes for the drain and ``status`` (``Looker.publish``)."""
        from reconciler.store.door_state import write_door_state

        view = self.door.view
        lanes = {
            r: {"in_flight": self.door.in_flight.get(r, 0), "admitting": self.door.admitting(r)}
            for r in {*self.door.in_flight, *(view.lanes if view else {})}
        }
        write_door_state(
            self.world.host_name,
            {"at": self.at, "looked": self.applied, "lanes": lanes, "models": self.door.models_now()},
        )

    def front(self, host: str, recipe: str) -> tuple[float, int, bool] | None:
        """``HostIO.lanes.front`` as the drain calls it (``reconciler.store.door_state.door_lane``, the real reader):
        its first call for a lane begins that lane's drain, which (l) judges the door's sends by."""
        from reconciler.store.door_state import door_lane

        lane = self.world.lane_on(self.world.ports.get(recipe))
        SEEN["drain reads"] += 1
        if lane is not None and self._drain_began(lane.id) is None:
            SEEN["drains"] += 1
            self.draining[lane.id] = (self.world.now, len(self.world.sleep_calls), lane.restarts)
        return door_lane(host, recipe)

    def _drain_began(self, cid: str | None) -> float | None:
        """When the drain of container ``cid`` began (the monotonic clock), unless it has been woken since (a lane put to
        sleep after its drain serves again once woken) or has woken itself (its container restarted: only a lane
        asleep restarts in the world, so its drain had ended in that sleep)."""
        began = self.draining.get(cid) if cid else None
        if began is None:
            return None
        lane = self.world.containers.get(cid)  # type: ignore[arg-type]
        restarted = lane is not None and lane.restarts > began[2]
        if restarted or any(kind == "wake" and c == cid for kind, c, _ in self.world.sleep_calls[began[1] :]):
            del self.draining[cid]  # type: ignore[arg-type]
            return None
        return began[0]

    def step_ended(self) -> None:
        """After each step: a drain that did not end in a stop or a sleep (cancelled, its stop refused) is over."""
        for cid in list(self.draining):
            c = self.world.containers.get(cid)
            if c is not None and c.state == "running" and c.sleep_state == "awake":
                del self.draining[cid]
        self.settle()

    def pass_ended(self, topology: str | None, last_pass: dict[str, Any]) -> None:
        """The loop's pass ended (``loop.last_pass``, made under ``topology``): what a later look may learn of it."""
        if last_pass.get("at") is not None:
            blocked = str(last_pass.get("message") or "blocked") if last_pass.get("result") == "blocked" else ""
            self.passes[float(last_pass["at"])] = (topology, blocked)

    def close(self) -> None:
        SEEN.update(self.answers)
        SEEN.update(
            {
                "forwarded": self.forwarded,
                "excused": self.excused,
                "refused": self.refused,
                "demand switches": len(self.switches),
                "doors": 1,
            }
        )
        for t in self.clients:
            t.cancel()
        try:
            self.settle()
        finally:
            self.loop.close()
            if self._waited in self.world.on_sleep:
                self.world.on_sleep.remove(self._waited)
            self.world.door = None

    # ------------------------------------------------------------ clients

    def names(self) -> list[str]:
        """The names a client may ask for now (the door's, as its ``/v1/models`` lists them)."""
        self.tick()
        view = self.door.view
        return sorted(view.names) if view is not None and view.names else ["sim/nope"]

    def pick(self, pick: int) -> str:
        """A name the door serves (by ``pick``), or now and then one it does not know."""
        names = self.names()
        return "sim/nope" if pick == 7 else names[pick % len(names)]

    def ask(self, model: str, n: int, seconds: float, client: int, *, demand: bool = True) -> None:
        """``n`` clients send a streaming request for ``model`` to the door, each answered in ``seconds``."""
        self.tick(demand=demand)
        for _ in range(n):
            gone = asyncio.Event()
            task = self.loop.create_task(self._client(model, seconds, f"client-{client}", gone))
            self.gone_clients[task] = gone
            self.clients.append(task)
        self.settle()
        if demand:
            self.look(demand=True)  # the door's next turn, at once: its demand policy sees what it holds now
        self.clients = [t for t in self.clients if not t.done()]
        self.gone_clients = {t: e for t, e in self.gone_clients.items() if not t.done()}

    def leave(self, pick: int) -> None:
        """A client goes away: the door hears its disconnect (a held request gives up its place), and a stream it
        was reading is cancelled."""
        live = [t for t in self.clients if not t.done()]
        if live:
            task = live[pick % len(live)]
            self.gone_clients[task].set()
            self.settle()
            if not task.done():
                task.cancel()
                self.settle()

    async def _client(self, model: str, seconds: float, user: str, gone: asyncio.Event) -> None:
        from starlette.requests import Request

        body = json.dumps({"model": model, "stream": True, "user": user, "messages": []}).encode()
        scope = {
            "type": "http",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"127.0.0.1:9466"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-sim-seconds", repr(seconds).encode()),
                (b"x-sim-request", str(next(self._ids)).encode()),
            ],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 9466),
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await gone.wait()  # the client stays until it goes away (``leave``)
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        cut = False

        async def send(message: dict[str, Any]) -> None:
            nonlocal cut
            cut = cut or b'"lane_failed"' in message.get("body", b"")

        resp = None
        try:
            resp = await self.door.openai(Request(scope, receive))
            if hasattr(resp, "upstream"):  # the lane's answer, relayed as the server runs it
                await resp(scope, receive, send)
        except asyncio.CancelledError:
            raise  # the client went away while its answer streamed
        except Exception as exc:  # noqa: BLE001 - invariant (e): nothing escapes the door's route
            self.world.violate(f"(e) {type(exc).__name__} escaped the door's answer to {model!r}: {exc}")
            return
        finally:
            if hasattr(resp, "upstream"):
                resp.close()  # as the door's server does, whether the answer was sent or cancelled
        body_of = getattr(resp, "body", b"")
        code = json.loads(bytes(body_of)).get("error", {}).get("code", "") if body_of.startswith(b"{") else ""
        self.answers[f"{resp.status_code} {code}{' cut' if cut else ''}".rstrip()] += 1

    # ------------------------------------------------------------ the lanes, behind the door's upstream session

    def lane_answers(self, port: int | None, data: bytes, headers: dict[str, str]) -> _LaneAnswer:
        """What a lane's port answers the door's request, the send judged by (l) at this instant. Nothing listening
        refuses the connection (no lane was reached: the door holds the request again, once)."""
        lane = self.world.lane_on(port)
        if lane is None and port not in self.world.squatted_ports:
            self.refused += 1
            key = SimpleNamespace(host="127.0.0.1", port=port, ssl=False)
            raise aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused (simulated)"))
        self.forwarded += 1
        self._judge_send(port, json.loads(data).get("model", "?"))
        if lane is None:  # a squatter (a process outside any container) answers on the lane's port
            return _LaneAnswer(self.world, Container("-", "squatter", "-", {}, {}, [], []), 0.0, status=404)
        seconds = float(headers.get("x-sim-seconds", "1"))
        if lane.sleep_state != "awake":
            return _LaneAnswer(self.world, lane, 0.0, status=503)
        self.world.requests_arrive(lane, 1, seconds)
        answer = _LaneAnswer(self.world, lane, seconds)
        self.streams.append(answer)
        return answer

    # ------------------------------------------------------------ the judges

    def _saw(self, view: Any) -> None:
        """A look: the world's truth of each lane's port at this instant, and what the look could know of the loop's
        last pass (``reconciler.store.loop_state``, as ``door_view`` reads it) and of the running topology."""
        from reconciler.store.loop_state import read_loop_state

        w = self.world
        for recipe in view.lanes:
            port = w.ports.get(recipe)
            if port is not None:
                c = w.lane_on(port)
                self.truth[port] = (c.id if c else None, c is not None and c.sleep_state == "awake")
        last = (read_loop_state(w.host_name) or {}).get("last_pass")
        seen = self.passes.get(float(last["at"])) if isinstance(last, dict) and last.get("at") is not None else None
        # The loop's state names the topology each pass was made under, and the door reads it: a look learns of
        # that topology, whichever the manifest names at the look.
        if seen is not None and seen[0] is not None:
            if seen[1]:
                self.known_blocked[seen[0]] = seen[1]
            else:
                self.known_blocked.pop(seen[0], None)
        if view.topology != self.seen[0]:
            self.seen = (view.topology, w.now)

    def _judge_send(self, port: int | None, model: str) -> None:
        """Invariant (l) at the send itself."""
        w = self.world
        c = w.lane_on(port)
        serving = c is not None and c.sleep_state == "awake"
        last = self.truth.get(port) if port is not None else None
        cid = c.id if c is not None else (last[0] if last else None)
        began = self._drain_began(cid)
        if serving and (began is None or began >= self.applied):
            return  # healthy, awake, and no drain of it the door has looked since (a look begun after it, strictly)
        if c is None and port in w.squatted_ports:
            # A process outside any container answers the lane's health URL on its port: the door, which reads that
            # URL as the loop does, takes it for the lane (the loop's plan blocks the lane's enter, naming it).
            self.excused += 1
            return
        if not serving and last is not None and last[1] and last[0] == cid and (began is None or began >= self.applied):
            self.excused += 1  # it went away since the door last looked: the world's doing
            return
        if serving:
            what = f"{c.name} (healthy and awake), whose drain began before the door's last look"
        elif c is None:
            what = "no lane of this install answers (stopped, or not booted)"
        else:
            what = f"{c.name} is {'asleep' if c.asleep else 'half woken'}"
        w.violate(f"(l) the door sent a request for {model!r} to port {port}, where {what}")

    def _switch(self, to: str) -> Any:
        """The demand policy's switch: the service's own (``reconciler switch``, audited with the door as its caller),
        judged by invariant (m) when it wrote."""
        result = self._service().switch(to)
        if result.changed:
            self._judge_switch(result.before, result.after)
            self.switches.append((self.world.now, result.before, result.after))
            self.seen = (result.after, self.world.now)
            self.on_switch(result.after)
        return result

    def _judge_switch(self, before: str, to: str) -> None:
        w = self.world
        policy = self.door.demand
        dwell = policy.spec.min_dwell_s if policy is not None else 0.0
        if to in self.known_blocked:
            w.violate(
                f"(m) the door switched {before} -> {to}, which a look saw blocked ({self.known_blocked[to]}) and "
                "none has seen unblocked since"
            )
        since = self.seen[1] if self.seen[0] == before else -math.inf
        if w.now - since < dwell:
            w.violate(
                f"(m) the door switched {before} -> {to} {w.now - since:.1f} s after {before} began to run as it saw "
                f"it (or after its own last switch), within demand.min_dwell_s {dwell:g} s"
            )


class _Looked:
    """What ``door_view`` asks of the service: the desired state (loaded by the door when its files changed) and the
    host's I/O (the world's)."""

    def __init__(self, desired: Any, io: Any):
        self._desired = desired
        self.io = io

    def desired(self) -> Any:
        return self._desired
