"""The front door's ASGI app: OpenAI's paths routed by the request's ``model`` to the lane that serves it, held
while that lane is not serving, streamed back as it comes (docs/design.md, the front door).

``Door`` keeps the last look at the host (``reconciler.service.door_view.DoorView``, refreshed by
``reconciler.door.run``), the requests held per model (``reconciler.door.hold``), the requests in flight per lane
(published for the drain) and the metrics. Upstream requests go through one ``aiohttp.ClientSession`` (streaming, a
connection pool per lane, never a proxy from the environment); a client that goes away cancels its upstream request,
and a lane that fails mid-stream ends the stream with an error event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import math
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.base import jsonstrict
from reconciler.base.clock import REAL_CLOCK, Clock
from reconciler.base.errors import ReconcilerError
from reconciler.door.demand import DemandPolicy, note_blocked
from reconciler.door.hold import Holds, Refused
from reconciler.door.metrics import DoorMetrics
from reconciler.model import DoorConfig
from reconciler.service.door_view import HOLDABLE, DoorView, LaneState

# A serving lane whose health check misses while its topology still runs keeps serving for this many looks: a lane
# busy with many streams answers its health URL late, and holding every new request for it then would cost each of
# them a look or more. A lane that refuses the door's connection is taken as entering at once (``_lane_gone``).
SLOW_LOOKS = 3

# A request held while the name it asks for moves to another lane (an alias pointed elsewhere) is admitted again for
# the new one, at most this many times.
MOVES = 4

# Headers that describe one connection (RFC 9110 7.6.1) or that the door sets itself: never passed on.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

# A lane's answer headers not passed on: the hop headers, and those the door's server sets itself (a client would get two
# of each).
_ANSWER_DROPPED = _HOP | {"date", "server"}


def openai_error(status: int, message: str, *, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error as OpenAI's API shapes one."""
    body = {"error": {"message": message, "type": _TYPES.get(status, "error"), "param": None, "code": kind}}
    return JSONResponse(body, status_code=status, headers=headers)


# What a request whose client went away while it was held is counted as (nginx's "client closed request").
CLIENT_GONE = 499

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
}


class Door:
    """The door's state, shared by its routes and its look at the host."""

    def __init__(
        self,
        config: DoorConfig,
        *,
        token: str | None = None,
        metrics: DoorMetrics | None = None,
        publish: Callable[[], None] = lambda: None,
        clock: Clock = REAL_CLOCK,
    ):
        self.config = config
        self.clock = clock  # the host's clocks (the simulation hands in its world's)
        self.token = token
        self.metrics = metrics or DoorMetrics()
        self.view: DoorView | None = None
        self.holds = Holds(max_queue=config.max_queue, hold_s=config.hold_s)
        self.in_flight: dict[str, int] = {}
        self.last_request: dict[str, float] = {}  # epoch seconds, as status shows them
        self.last_asked: dict[str, float] = {}  # the same on the monotonic clock, for the demand policy
        self.publish = publish
        self.session: aiohttp.ClientSession | None = None
        self.demand: DemandPolicy | None = None  # the manifest's demand: (opt-in)
        self.blocked: dict[str, str] = {}  # topology -> the blocker a look saw while it ran (the policy's own too)
        self.misses: dict[str, int] = {}  # per recipe: looks in a row that found a serving lane not healthy

    # ------------------------------------------------------------ the host's state

    def admitting(self, recipe: str) -> bool:
        lane = self.view.lanes.get(recipe) if self.view else None
        return lane is not None and lane.state == "serving"

    def models_now(self) -> dict[str, dict[str, Any]]:
        """Per model name and alias, as ``status`` shows it: its lane's recipe and state, the requests held for it
        now, how long the oldest of them has waited, and when it was last asked for (epoch seconds, or None)."""
        view = self.view
        if view is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for name, recipe in sorted(view.names.items()):
            lane = view.lanes.get(recipe)
            out[name] = {
                "recipe": recipe,
                "state": lane.state if lane else "not-in-topology",
                "queue": self.holds.depth(name),
                "held_s": round(self.holds.oldest_s(name), 3),
                "last_request": self.last_request.get(name),
            }
        return out

    def apply_view(self, view: DoorView) -> None:
        """A new look at the host: release each model's held requests whose lane serves now, refuse those whose
        lane can no longer come (its topology blocked, or run by no topology)."""
        view = self._steady(view)
        self.view = view
        spec = view.desired.demand if view.desired is not None else None
        if spec is None:
            self.demand = None
        elif self.demand is None or self.demand.spec != spec:
            self.demand = DemandPolicy(spec, blocked=self.blocked)  # what it saw blocked outlives the old spec
        note_blocked(self.blocked, view)
        if self.demand is not None:
            self.demand.observe(view, self.clock.monotonic())
        for model in list(self.holds.queues):
            recipe = view.recipe_of(model)
            lane = view.lanes.get(recipe) if recipe else None
            if lane is not None and lane.state != "serving" and self._on_demand(view, recipe):
                continue  # a demand switch brings it (or refuses it, naming the blocker): see demand_step
            if lane is None:
                self.holds.refuse(
                    model, Refused(404, f"model {model!r} is no longer served", retry_after=0, kind="gone")
                )
            elif lane.state == "serving":
                self.holds.release(model)
            elif lane.state not in HOLDABLE:
                self.holds.refuse(model, self._not_served(model, lane.state, lane.why))
        for model in {*self.holds.queues, *self.metrics.queued_models}:
            self.metrics.queue_depth(model, self.holds.depth(model))

    def _steady(self, view: DoorView) -> DoorView:
        """``view`` with each lane that served at the last look, whose topology still runs and whose health check
        alone missed now, kept serving for up to ``SLOW_LOOKS`` looks in a row."""
        before = self.view.lanes if self.view is not None else {}
        lanes: dict[str, LaneState] = dict(view.lanes)
        for recipe, lane in view.lanes.items():
            prev = before.get(recipe)
            if lane.state == "entering" and prev is not None and prev.state == "serving":
                misses = self.misses.get(recipe, 0) + 1
                if misses < SLOW_LOOKS:
                    self.misses[recipe] = misses
                    lanes[recipe] = dataclasses.replace(lane, state="serving", why="")
                    continue
            self.misses.pop(recipe, None)
        return dataclasses.replace(view, lanes=lanes) if lanes != dict(view.lanes) else view

    def _lane_gone(self, recipe: str) -> None:
        """The lane refused the door's connection: entering (held for) until a look finds it healthy again."""
        view = self.view
        lane = view.lanes.get(recipe) if view is not None else None
        if view is None or lane is None or lane.state != "serving":
            return
        gone = dataclasses.replace(lane, state="entering", why="it refused the door's connection")
        self.view = dataclasses.replace(view, lanes={**view.lanes, recipe: gone})

    def _on_demand(self, view: DoorView, recipe: str | None) -> bool:
        return self.demand is not None and recipe is not None and self.demand.target(view, recipe) is not None

    async def demand_step(self, switch: Callable[[str], Any]) -> None:
        """The demand policy's turn after a look (``reconciler.door.demand``): switch the host, through the service,
        for the requests held now, refuse at once those whose topology is blocked, or go back to the default when
        the running topology has been idle long enough. ``switch`` is the service's switch (blocking: run in a
        thread), audited with the door as its caller."""
        view, policy = self.view, self.demand
        if view is None or policy is None:
            return
        now = self.clock.monotonic()  # durations: never the wall clock, which may be stepped
        to, refuse = policy.wanted(view, list(self.holds.queues), now)
        for model, why in refuse.items():
            self.holds.refuse(
                model,
                Refused(
                    503,
                    f"model {model!r} cannot be served: {why}",
                    retry_after=min(self.config.hold_s, 30.0),
                    kind="blocked",
                ),
            )
        if to is None:
            to = policy.idle_return(
                view, in_flight=self.in_flight, held=bool(self.holds.queues), last_request=self.last_asked, now=now
            )
        if to is None or to == policy.topology:
            return
        before = policy.topology or ""
        try:
            await asyncio.to_thread(switch, to)
        except (ReconcilerError, OSError) as exc:  # refused (the manifest changed meanwhile, a lock): tried later
            policy.since = now
            print(f"reconciler door: the demand switch {before} -> {to} failed: {exc}", file=sys.stderr)
            return
        policy.switched(to, now)
        self.metrics.switches.labels(**{"from": before, "to": to}).inc()

    def _not_served(self, model: str, state: str, why: str) -> Refused:
        if state == "blocked":
            text = f"model {model!r} cannot be served: its topology is blocked ({why})"
        else:
            text = f"model {model!r} is not served now: its lane is {state} ({why})"
        return Refused(503, text, retry_after=min(self.config.hold_s, 30.0), kind=state.replace("-", "_"))

    # ------------------------------------------------------------ routes

    async def models(self, request: Request) -> Response:
        if (denied := self._check_token(request)) is not None:
            return denied
        view = self.view
        data: list[dict[str, Any]] = []
        if view is not None:
            for name, recipe in sorted(view.names.items()):
                lane = view.lanes[recipe]
                entry: dict[str, Any] = {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "reconciler",
                    "reconciler": {"recipe": recipe, "state": lane.state},
                }
                if name in view.aliases:
                    entry["reconciler"]["alias"] = True
                data.append(entry)
        return JSONResponse({"object": "list", "data": data})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": self.view is not None})

    async def metrics_route(self, request: Request) -> Response:
        body, ctype = self.metrics.render()
        return Response(body, media_type=ctype)

    def _check_token(self, request: Request) -> Response | None:
        if self.token is None:
            return None
        given = request.headers.get("authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), self.token.encode()):
            return None
        return openai_error(401, "the front door needs its token: Authorization: Bearer TOKEN", kind="unauthorized")

    async def _body(self, request: Request) -> bytes | Response:
        limit = int(self.config.max_body_mib * (1 << 20))
        declared = request.headers.get("content-length")
        too_big = openai_error(
            413, f"the request body is over door.max_body_mib ({self.config.max_body_mib:g} MiB)", kind="too_large"
        )
        if declared and declared.isdigit() and int(declared) > limit:
            return too_big
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return too_big
                chunks.append(chunk)
        except ClientDisconnect:
            return Response(status_code=400)
        return b"".join(chunks)

    async def openai(self, request: Request) -> Response:
        """Any ``/v1/*`` carrying a ``model``: held until its lane serves, then passed to it."""
        if (denied := self._check_token(request)) is not None:
            return denied
        raw = await self._body(request)
        if isinstance(raw, Response):
            return self._count("-", raw)
        try:
            body = jsonstrict.loads(raw)
        except (ValueError, RecursionError) as exc:
            return self._count("-", openai_error(400, f"the request body is not JSON: {exc}", kind="bad_json"))
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            return self._count("-", openai_error(400, 'the request names no model (a string "model")', kind="no_model"))
        view = self.view
        recipe = view.recipe_of(model) if view else None
        if view is None or recipe is None:
            known = sorted(view.names) if view else []
            return self._count(
                "-",
                openai_error(
                    404,
                    f"the model {model!r} does not exist here; known: {', '.join(known) or 'none'}",
                    kind="unknown_model",
                ),
            )
        self.last_request[model] = self.clock.time()
        self.last_asked[model] = self.clock.monotonic()
        for last in (False, True):
            admitted = await self._admit_by_name(request, model, recipe, body)
            if isinstance(admitted, Response):
                return admitted
            view, recipe = admitted
            lane = view.lanes[recipe]
            if model in view.aliases:
                body["model"] = lane.names[0]  # the lane knows its own names, not the manifest's aliases
                raw = json.dumps(body, separators=(",", ":")).encode()
            sent = await self._forward(request, model, recipe, lane.origin or "", raw, last=last)
            if sent is not None:
                return sent
            self._lane_gone(recipe)  # held again, once, until a look finds it healthy
        raise AssertionError("unreachable: the last attempt answers")

    async def _admit_by_name(
        self, request: Request, model: str, recipe: str, body: dict[str, Any]
    ) -> Response | tuple[DoorView, str]:
        """``_admit`` for the lane that serves ``model`` under the view it was admitted by: a name may move while its
        request is held (an alias pointed elsewhere, a topology that serves the name by another recipe), and then the
        request is admitted again for the lane that serves the name now. (The view, the recipe) once one serves,
        else the refusal."""
        for _ in range(MOVES):
            refused = await self._admit(request, model, recipe, body)
            if refused is not None:
                return refused
            view = self.view
            now = view.recipe_of(model) if view is not None else None
            if view is None or now is None:
                why = f"model {model!r} is no longer served"
                return self._refused(model, Refused(404, why, retry_after=0, kind="gone"))
            if now == recipe and recipe in view.lanes:
                return view, recipe
            recipe = now
        why = f"the lane serving {model!r} changed {MOVES} times while the request was held"
        return self._refused(model, Refused(503, why, retry_after=1, kind="not_served"))

    async def _admit(self, request: Request, model: str, recipe: str, body: dict[str, Any]) -> Response | None:
        """None once ``recipe``'s lane serves (at once, or after the request was held for it), else the refusal."""
        view = self.view
        lane = view.lanes.get(recipe) if view is not None else None
        if view is None or lane is None:
            return self._refused(
                model, Refused(404, f"model {model!r} is no longer served", retry_after=0, kind="gone")
            )
        if lane.state == "serving":
            return None
        target = self.demand.target(view, recipe) if self.demand is not None else None
        if target is not None and self.demand is not None and target in self.demand.blocked:
            why = f"topology {target!r} is blocked: {self.demand.blocked[target]}"
            return self._refused(model, self._not_served(model, "blocked", why))
        if lane.state not in HOLDABLE and target is None:
            return self._refused(model, self._not_served(model, lane.state, lane.why))
        client = f"{request.client.host if request.client else '-'}/{body.get('user', '')}"
        try:
            held_s = await self._hold(request, model, client, why=f"its lane is {lane.state}: {lane.why}")
        except Refused as exc:
            return self._refused(model, exc)
        finally:
            self.metrics.queue_depth(model, self.holds.depth(model))
        if held_s is None:  # the client went away while held: nothing to send, nobody to send it to
            return self._count(model, Response(status_code=CLIENT_GONE))
        self.metrics.held(held_s)
        return None

    async def _hold(self, request: Request, model: str, client: str, *, why: str) -> float | None:
        """Hold the request until its lane serves (the seconds held; ``Refused`` as ``Holds.wait``), or None as soon
        as its client goes away: a gone client gives up its place in the queue at once, so it neither takes a share
        of ``door.max_queue`` nor asks the demand policy for a switch that nobody waits for."""
        wait = asyncio.ensure_future(self.holds.wait(model, client, why=why))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (wait, gone):
                task.cancel()
            await asyncio.gather(wait, gone, return_exceptions=True)  # the waiter leaves its queue before we go on
        if gone.done() and not gone.cancelled():
            return None
        return wait.result()

    def _refused(self, model: str, exc: Refused) -> Response:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))} if exc.status == 503 else None
        return self._count(model, openai_error(exc.status, exc.why, kind=exc.kind, headers=headers))

    def _count(self, model: str, response: Response) -> Response:
        self.metrics.request(model, response.status_code)
        return response

    async def _forward(
        self, request: Request, model: str, recipe: str, origin: str, raw: bytes, *, last: bool
    ) -> Response | None:
        """The lane's answer, streamed back as it comes; None when the lane refused the connection and this was not
        the ``last`` attempt (the caller holds the request again)."""
        assert self.session is not None
        url = origin + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP and not (self.token is not None and k.lower() == "authorization")
        }
        self._enter(recipe)
        t0 = self.clock.monotonic()
        try:
            resp = await self.session.request(request.method, url, data=raw, headers=headers)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._leave(recipe)
            if isinstance(exc, aiohttp.ClientConnectorError) and not last:
                return None
            return self._count(
                model, openai_error(502, f"the lane of {model!r} did not answer: {exc}", kind="upstream")
            )
        except BaseException:
            self._leave(recipe)
            raise
        self.metrics.first_byte(self.clock.monotonic() - t0)
        self.metrics.request(model, resp.status)
        stream = "text/event-stream" in resp.headers.get("content-type", "")

        # OpenAI's completions streams end with "data: [DONE]": one that ends without it was cut (a lane that died
        # answering with a close-delimited body shows no transport error at all).
        ends_done = stream and request.url.path.rstrip("/").endswith(("/chat/completions", "/completions"))
        # The body is passed as the lane sent it (not decompressed): its Content-Encoding goes with it.
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _ANSWER_DROPPED}
        return _Relay(resp, out, model, stream=stream, ends_done=ends_done, done=lambda: self._leave(recipe))

    def _enter(self, recipe: str) -> None:
        self.in_flight[recipe] = self.in_flight.get(recipe, 0) + 1

    def _leave(self, recipe: str) -> None:
        self.in_flight[recipe] = max(0, self.in_flight.get(recipe, 0) - 1)
        if not self.in_flight[recipe]:
            self.publish()  # the drain may be waiting for this very count

    def app(self) -> Any:
        """The door as one ASGI app: the requests to forward go to ``openai`` straight from the server (each of a
        stream's chunks then passes no middleware: it is the door's whole cost per token), the rest through
        Starlette's routes; the upstream session lives as long as the app."""

        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            # No limit on connections (each held request needs one when its lane serves), none from the environment.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
            timeout = aiohttp.ClientTimeout(total=None, connect=5.0)
            async with aiohttp.ClientSession(
                connector=connector, timeout=timeout, trust_env=False, auto_decompress=False
            ) as session:
                self.session = session
                yield
                self.session = None

        routes = [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
            Route("/v1/{rest:path}", self.openai, methods=["POST"]),
        ]
        rest = Starlette(routes=routes, lifespan=_as_cm(lifespan))

        async def door(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/v1/"):
                response = await self.openai(Request(scope, receive))
                await _answer(response, scope, receive, send)
            else:
                await rest(scope, receive, send)

        return door


class _Relay(Response):
    """The lane's answer passed to the client as it comes: each read of what has arrived (under load several of the
    lane's events in one) is one ASGI send, with no generator or middleware between (a stream's chunks are the
    door's whole cost per token). A stream that fails mid-way ends with an OpenAI-shaped error event. ``close``
    (called by ``_answer`` in any case, and at the end of the send) gives the lane's connection back to the pool when
    the body was read whole, else closes it, which cancels the request upstream; then ``done`` runs, once."""

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        headers: dict[str, str],
        model: str,
        *,
        stream: bool,
        ends_done: bool,
        done: Callable[[], None],
    ):
        # Response's own fields, set here rather than by its constructor, which would add a Content-Length of 0:
        # the headers go as the lane sent them (its Content-Length dropped with the other hop headers).
        self.status_code, self.body, self.background = upstream.status, b"", None
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.upstream, self.model, self.stream, self.ends_done, self._done = upstream, model, stream, ends_done, done
        self.whole = False
        self.closed = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            reads = self.upstream.content.iter_any().__aiter__()
            tail, failed = b"", ""
            while True:
                try:
                    chunk = await reads.__anext__()
                except StopAsyncIteration:
                    failed = "the stream ended without [DONE]" if self.ends_done and b"[DONE]" not in tail else ""
                    self.whole = True
                    break
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    failed = str(exc) or type(exc).__name__
                    break
                tail = (tail + chunk)[-64:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            last = b""
            if failed and self.stream:
                message = f"the lane of {self.model!r} failed mid-stream: {failed}"
                error = {"error": {"message": message, "type": "upstream", "code": "lane_failed"}}
                last = b"data: " + json.dumps(error).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": last, "more_body": False})
        except (OSError, ClientDisconnect):
            return  # the client went away (a server whose send raises then): nobody to answer
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            (self.upstream.release if self.whole else self.upstream.close)()
            self._done()


async def _answer(response: Response, scope: Any, receive: Any, send: Any) -> None:
    """Send ``response``; a client that goes away ends it at once. Servers differ in how a send after the client has
    gone behaves (one raises, another drops it quietly while the stream goes on to its end), so the door watches for
    the disconnect itself and cancels the response; a relay is closed in any case, which closes the lane's request
    when its body was not read whole (a response cancelled before it began never reaches its own clean-up)."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    sending = asyncio.ensure_future(response(scope, receive, send))
    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sending, watching):
            task.cancel()
        results = await asyncio.gather(sending, watching, return_exceptions=True)
        if isinstance(response, _Relay):
            response.close()
    failed = results[0]
    if isinstance(failed, BaseException) and not isinstance(failed, asyncio.CancelledError):
        raise failed


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (its body is read already, so the next ASGI message is its disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _as_cm(fn: Callable[[Starlette], AsyncIterator[None]]) -> Any:
    import contextlib  # start-up: only the door builds an app

    return contextlib.asynccontextmanager(fn)
