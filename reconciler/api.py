"""The HTTP JSON API of ``reconciler run``, with MCP at ``/mcp``, ``/metrics`` and ``/healthz`` on one listener.

A Starlette app served by uvicorn in a thread of the loop (``Listener``), a thin front-end over the service layer
(``reconciler.service``) like the command line and ``reconciler mcp``:

    GET  /v1/status          status --json
    GET  /v1/plan[?save=true] plan --json (with save: kept under the state dir, its "plan_id" for POST /v1/apply)
    GET  /v1/shm             shm status --json
    GET  /v1/audit[?since=]  the audit trail (since: epoch seconds, an ISO time, or an age like 15m, 2h, 7d)
    POST /v1/shm/reclaim     {"confirm": true, "paths": [...]}: the guarded cleanup (without confirm a dry run)
    POST /v1/apply           {"plan_id": "..."}: a plan saved by /v1/plan?save=true, refused when stale
    GET  /v1/openapi.json    this API as OpenAPI 3.1
    /mcp                     the MCP server (reconciler.mcp_server), streamable HTTP
    GET  /metrics, /healthz  as before, without a token (Prometheus and supervisors)

Each answer's body is exactly the command line's ``--json`` (redacted once more on its way out); the command's exit
code rides in ``X-Reconciler-Exit-Code``. A POST whose command would exit non-zero (a refused reclaim, a stale or
blocked apply) answers 409 with the same body; an invalid configuration 422; a bad request 400.

Security: every path but ``/metrics`` and ``/healthz`` needs ``Authorization: Bearer TOKEN`` (compared in constant
time), reads included; the token comes from ``--api-token-file``, ``$RECONCILER_API_TOKEN``, or a file generated on
first start (0600, ``$RECONCILER_STATE_DIR/HOST/api-token``); its name (the file's name, or ``env``) is the caller
in the audit trail, its value is never logged or answered. The listener is loopback unless ``--api-allow-remote``
is given, and then only with a token given explicitly. Request bodies are limited (64 KiB: 413). A destructive call
(a confirmed reclaim, an apply) takes the loop's pass lock: it waits for a pass to end, and no pass starts while it
runs.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from reconciler.errors import ReconcilerError

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from reconciler.service import HostService

MAX_BODY = 64 << 10
TOKEN_ENV = "RECONCILER_API_TOKEN"
TOKEN_FILE = "api-token"
MIN_TOKEN_CHARS = 16
PUBLIC = frozenset({"/metrics", "/healthz"})  # every other path needs the token
_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII without spaces: what a header can carry


class ApiSetupError(ReconcilerError):
    """The API cannot be served as asked: a token file that is unusable, a remote address without the flag."""


# ---------------------------------------------------------------- the token


@dataclass(frozen=True)
class ApiToken:
    value: str
    name: str  # who the caller is in the audit trail: the token file's name, or "env"
    source: str  # "file" | "env" | "generated"
    path: str | None = None

    def matches(self, presented: bytes) -> bool:
        return hmac.compare_digest(presented, self.value.encode())

    def describe(self) -> str:
        """Where the token is, for the log: never its value."""
        return {"env": f"${TOKEN_ENV}", "file": f"{self.path}", "generated": f"{self.path} (generated)"}[self.source]


def _check_value(value: str, where: str) -> str:
    value = value.strip()
    if not value:
        raise ApiSetupError(f"{where} is empty: put a token (at least {MIN_TOKEN_CHARS} characters) in it")
    if len(value) < MIN_TOKEN_CHARS or not _TOKEN_CHARS.match(value):
        raise ApiSetupError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} printable characters and no spaces")
    return value


def _read_token_file(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ApiSetupError(f"cannot read the API token file {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ApiSetupError(f"the API token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ApiSetupError(f"the API token file {path} can be read by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                                f"chmod 600 {path}")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        return _check_value(data.decode("ascii"), f"the API token file {path}")
    except UnicodeDecodeError:
        raise ApiSetupError(f"the API token file {path}: not a printable ASCII token") from None


def resolve_token(host: str, *, token_file: str | None = None, environ: dict[str, str] | None = None) -> ApiToken:
    """The API's token: ``--api-token-file``, else ``$RECONCILER_API_TOKEN``, else the host's generated one (made
    now, 0600, when there is none yet)."""
    env = os.environ if environ is None else environ
    if token_file:
        path = Path(token_file)
        return ApiToken(_read_token_file(path), path.name, "file", str(path))
    if env.get(TOKEN_ENV) is not None:
        return ApiToken(_check_value(env[TOKEN_ENV], f"${TOKEN_ENV}"), "env", "env")
    from reconciler.state import host_dir

    path = host_dir(host) / TOKEN_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return ApiToken(_read_token_file(path), path.name, "generated", str(path))
    except OSError as exc:
        raise ApiSetupError(f"cannot create the API token file {path}: {exc.strerror or exc} (give one with "
                            f"--api-token-file or ${TOKEN_ENV})") from None
    value = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return ApiToken(value, path.name, "generated", str(path))


# ---------------------------------------------------------------- the listener's address


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; an empty host is 127.0.0.1); ValueError when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{addr!r} is not HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    n = int(port)
    if not 0 <= n <= 65535:
        raise ValueError(f"port {n} is out of range")
    return host, n


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (OSError when the address is in use or not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def check_exposure(host: str, *, allow_remote: bool, token: ApiToken) -> None:
    """Loopback by default; any other address needs ``--api-allow-remote`` and a token given explicitly."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ApiSetupError(
            f"{host} is not a loopback address: the API and MCP (and their destructive calls) would be reachable "
            "from other machines. Pass --api-allow-remote to mean it (with a token of your own), or listen on "
            "127.0.0.1")
    if token.source == "generated":
        raise ApiSetupError(f"--api-allow-remote needs a token given explicitly: --api-token-file FILE or ${TOKEN_ENV}")


# ---------------------------------------------------------------- the guard: token and body size


class Guard:
    """Pure ASGI middleware: the bearer token on every path but ``PUBLIC``, and the request body limit."""

    def __init__(self, app: Any, *, token: ApiToken, max_body: int = MAX_BODY,
                 on_refused: Callable[[str, str], None] | None = None):
        self.app = app
        self.token = token
        self.max_body = max_body
        self.on_refused = on_refused

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        if path not in PUBLIC:
            auth = headers.get(b"authorization", b"")
            scheme, _, presented = auth.partition(b" ")
            if not auth or scheme.lower() != b"bearer":
                await self._refuse(send, path, "no bearer token: send Authorization: Bearer TOKEN")
                return
            if not self.token.matches(presented.strip()):
                await self._refuse(send, path, "wrong token")
                return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body
            except ValueError:
                await _send_json(send, 400, {"error": "Content-Length is not a number"})
                return
            if too_big:
                await _send_json(send, 413, {"error": f"request body over {self.max_body} bytes"})
                return
        seen = 0
        started = False

        async def limited_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _TooLarge
            return message

        async def tracked_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _TooLarge:
            if not started:
                await _send_json(send, 413, {"error": f"request body over {self.max_body} bytes"})

    async def _refuse(self, send: Any, path: str, why: str) -> None:
        if self.on_refused is not None:
            self.on_refused(path, why)
        await _send_json(send, 401, {"error": why}, extra=[(b"www-authenticate", b'Bearer realm="reconciler"')])


class _TooLarge(Exception):
    pass


async def _send_json(send: Any, status: int, body: dict[str, Any], *, extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": data})


# ---------------------------------------------------------------- the serialisation with the loop


class FairLock:
    """The loop's pass lock: first come, first served (a ticket lock), so a call of the API or MCP that waits for a
    pass runs before the next pass, however busy the loop is. Not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = 0
        self._serving = 0

    def acquire(self) -> None:
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()

    def release(self) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PassGate:
    """What a destructive call of the API or MCP holds: the loop's pass lock, logged when taken and given back, so
    the loop's log shows that no pass ran meanwhile."""

    def __init__(self, lock: Any, log: Callable[..., None] | None, front: str):
        self.lock = lock
        self.log = log
        self.front = front
        self._t0 = 0.0

    def __enter__(self) -> Self:
        t = time.monotonic()
        self.lock.acquire()
        self._t0 = time.monotonic()
        if self.log:
            self.log("api-exclusive", front=self.front, waited_s=round(self._t0 - t, 3))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.log:
            self.log("api-exclusive-end", front=self.front, seconds=round(time.monotonic() - self._t0, 3))
        self.lock.release()


# ---------------------------------------------------------------- the app


def _bool_param(text: str | None, name: str) -> bool:
    if text is None or text.lower() in ("", "0", "false", "no"):
        return False
    if text.lower() in ("1", "true", "yes"):
        return True
    raise _BadRequest(f"{name}={text!r}: give true or false")


def since_param(text: str | None) -> float | None:
    """``since``: parsed by the service layer like the command line's ``--since``."""
    from reconciler.service import parse_since

    try:
        return parse_since(text)
    except ValueError as exc:
        raise _BadRequest(f"since={text!r}: {exc}") from None


class _BadRequest(Exception):
    pass


def openapi() -> dict[str, Any]:
    """This API as OpenAPI 3.1 (served at /v1/openapi.json)."""
    body_reclaim = {
        "type": "object", "additionalProperties": False,
        "properties": {"confirm": {"type": "boolean", "default": False,
                                   "description": "remove the orphans; without it a dry run"},
                       "paths": {"type": "array", "items": {"type": "string"},
                                 "description": "remove nothing but these paths (from a dry run)"}},
    }
    body_apply = {"type": "object", "additionalProperties": False, "required": ["plan_id"],
                  "properties": {"plan_id": {"type": "string", "pattern": "^[0-9a-f]{32}$",
                                             "description": "from GET /v1/plan?save=true"}}}
    obj = {"type": "object", "additionalProperties": True}

    def op(summary: str, *, params: list[dict[str, Any]] | None = None, body: dict[str, Any] | None = None,
           extra: dict[str, str] | None = None) -> dict[str, Any]:
        responses = {
            "200": {"description": "the command line's --json", "content": {"application/json": {"schema": obj}},
                    "headers": {"X-Reconciler-Exit-Code": {"schema": {"type": "integer"},
                                                           "description": "the command line's exit code"}}},
            "401": {"description": "no token, or a wrong one"},
            "422": {"description": "the configuration is invalid (problems with file:line)"},
            **{k: {"description": v} for k, v in (extra or {}).items()},
        }
        o: dict[str, Any] = {"summary": summary, "responses": responses}
        if params:
            o["parameters"] = params
        if body:
            o["requestBody"] = {"required": False, "content": {"application/json": {"schema": body}}}
        return o

    return {
        "openapi": "3.1.0",
        "info": {"title": "reconciler", "version": _version(),
                 "description": "The HTTP API of `reconciler run`: the same guarded operations as the command line."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/status": {"get": op("status --json")},
            "/v1/plan": {"get": op("plan --json (dry run)", params=[
                {"name": "save", "in": "query", "schema": {"type": "boolean"},
                 "description": "keep the plan; its plan_id is for POST /v1/apply"}])},
            "/v1/shm": {"get": op("shm status --json (read-only)")},
            "/v1/audit": {"get": op("the audit trail", params=[
                {"name": "since", "in": "query", "schema": {"type": "string"},
                 "description": "epoch seconds, an ISO time, or an age: 90s, 15m, 2h, 7d"}])},
            "/v1/shm/reclaim": {"post": op("shm reclaim --json: a dry run unless confirm", body=body_reclaim,
                                           extra={"409": "refused or failed (the body says why)",
                                                  "413": "request body too large"})},
            "/v1/apply": {"post": op("apply a saved plan; refused when stale", body=body_apply,
                                     extra={"409": "stale, blocked or failed (the body says which)",
                                            "413": "request body too large"})},
            "/v1/openapi.json": {"get": {"summary": "this description", "responses": {"200": {"description": "OK"}}}},
            "/mcp": {"post": {"summary": "MCP (streamable HTTP): host_status, host_plan, host_shared_memory, "
                                         "host_manage", "responses": {"200": {"description": "MCP"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [],
                                 "responses": {"200": {"description": "text exposition format"}}}},
            "/healthz": {"get": {"summary": "a recent pass that read every source", "security": [],
                                 "responses": {"200": {"description": "healthy"}, "503": {"description": "not"}}}},
        },
    }


def _version() -> str:
    from reconciler import __version__

    return __version__


def build_app(
    root: str,
    *,
    token: ApiToken,
    pass_lock: Any,
    bind_host: str = "127.0.0.1",
    log: Callable[..., None] | None = None,
    metrics: Callable[[], bytes] | None = None,
    health: Callable[[], tuple[int, dict[str, Any]]] | None = None,
    cancel: threading.Event | None = None,
    max_body: int = MAX_BODY,
) -> Any:
    """The ASGI app (the ``Guard`` around Starlette): /v1, /mcp, /metrics, /healthz."""
    import anyio.to_thread
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from reconciler.errors import ConfigError
    from reconciler.lock import LockHeld
    from reconciler.mcp_server import build_server
    from reconciler.redact import redact_data, redact_text
    from reconciler.service import Caller, HostService

    def service(front: str) -> HostService:
        return HostService(root, caller=Caller(front, token.name), pass_lock=PassGate(pass_lock, log, front))

    class ReclaimBody(BaseModel):
        model_config = ConfigDict(extra="forbid")
        confirm: StrictBool = False
        paths: list[str] | None = None

    class ApplyBody(BaseModel):
        model_config = ConfigDict(extra="forbid")
        plan_id: str = Field(pattern=r"^[0-9a-f]{32}$")

    def answer(res: Any, *, write: bool = False) -> Response:
        code = res.exit_code
        status = 409 if write and code != 0 else 200
        return JSONResponse(redact_data(res.to_json()), status_code=status,
                            headers={"X-Reconciler-Exit-Code": str(code)})

    def endpoint(fn: Callable[[Request], Any], *, write: bool = False) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                call = await fn(request)
                res = await anyio.to_thread.run_sync(call)
            except _BadRequest as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except ConfigError as exc:
                return JSONResponse({"error": "invalid configuration", "problems": [
                    {"path": p.path, "line": p.line, "message": redact_text(p.message)} for p in exc.problems]},
                    status_code=422)
            except LockHeld as exc:
                return JSONResponse({"error": redact_text(str(exc))}, status_code=409)
            except ReconcilerError as exc:
                return JSONResponse({"error": redact_text(str(exc))}, status_code=409)
            except Exception as exc:  # noqa: BLE001 - an answer, never a traceback, and the loop goes on
                if log:
                    log("api-error", path=request.url.path, error=f"{type(exc).__name__}: {exc}"[:300])
                return JSONResponse({"error": f"internal error ({type(exc).__name__}); see the reconciler's log"},
                                    status_code=500)
            return answer(res, write=write)

        return handle

    async def body_of(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        if not raw.strip():
            data: Any = {}
        else:
            ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype not in ("application/json", ""):
                raise _BadRequest(f"send the body as application/json, not {ctype}")
            try:
                data = json.loads(raw)
            except ValueError:
                raise _BadRequest("the body is not JSON") from None
        if not isinstance(data, dict):
            raise _BadRequest("the body must be a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise _BadRequest("; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                                        for e in exc.errors())) from None

    async def status(request: Request) -> Any:
        return lambda: service("api").status()

    async def plan(request: Request) -> Any:
        save = _bool_param(request.query_params.get("save"), "save")
        return lambda: service("api").plan(save=save)

    async def shm(request: Request) -> Any:
        return lambda: service("api").shm_status()

    async def audit(request: Request) -> Any:
        since = since_param(request.query_params.get("since"))
        return lambda: service("api").audit(since=since)

    async def reclaim(request: Request) -> Any:
        body = await body_of(request, ReclaimBody)
        return lambda: service("api").shm_reclaim(confirm=body.confirm, paths=body.paths)

    async def apply(request: Request) -> Any:
        body = await body_of(request, ApplyBody)
        return lambda: service("api").apply_saved(body.plan_id, cancel=cancel)

    async def spec(request: Request) -> Response:
        return JSONResponse(openapi())

    async def metrics_route(request: Request) -> Response:
        if metrics is None:
            return JSONResponse({"error": "no metrics here"}, status_code=404)
        from reconciler.metrics import CONTENT_TYPE

        return Response(metrics(), media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        if health is None:
            return JSONResponse({"ok": True})
        code, body = health()
        return JSONResponse(redact_data(body), status_code=code)

    mcp = build_server(lambda: service("mcp"))
    mcp_app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        transport_security=_transport_security(bind_host),
        host=bind_host,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield

    routes = [
        Route("/v1/status", endpoint(status), methods=["GET"]),
        Route("/v1/plan", endpoint(plan), methods=["GET"]),
        Route("/v1/shm", endpoint(shm), methods=["GET"]),
        Route("/v1/audit", endpoint(audit), methods=["GET"]),
        Route("/v1/shm/reclaim", endpoint(reclaim, write=True), methods=["POST"]),
        Route("/v1/apply", endpoint(apply, write=True), methods=["POST"]),
        Route("/v1/openapi.json", spec, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        *mcp_app.routes,
    ]
    app = Starlette(routes=routes, lifespan=lifespan)

    def refused(path: str, why: str) -> None:
        if log:
            log("api-refused", path=path[:200], reason=why)

    return Guard(app, token=token, max_body=max_body, on_refused=refused)


def _transport_security(host: str) -> Any:
    """MCP's own Host/Origin check (against DNS rebinding) on loopback; off when remote access was asked for, where
    the Host a client uses cannot be known here (the bearer token guards every request either way)."""
    from mcp.server.transport_security import TransportSecuritySettings

    if not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


# ---------------------------------------------------------------- serving it in a thread


class Listener:
    """uvicorn serving ``app`` on an already bound socket, in a daemon thread of the loop."""

    def __init__(self, app: Any, sock: socket.socket):
        import uvicorn

        self.sock = sock
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="on",
                                ws="none", timeout_graceful_shutdown=3)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self.error: BaseException | None = None

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - reported by start() or shutdown()
            self.error = exc

    def start(self, timeout: float = 15.0) -> Listener:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self.sock.close()
                raise ApiSetupError(f"the HTTP listener did not start: {self.error or 'timed out'}")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def shutdown(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.sock.close()
