"""Serving the app, and keeping it served: ``Listener`` (uvicorn on an already bound socket, in a daemon thread, its
event loop's errors logged and never ending it), ``Supervisor`` (the listener of ``reconciler run``, started again
when its thread ends, within ``RESTARTS_PER_HOUR``) and ``LogBridge`` (the libraries' own log records into the
loop's log).

Called by the loop when it serves ``--metrics-addr`` (``Supervisor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from reconciler.api.errors import ApiSetupError
from reconciler.api.hosts import bind
from reconciler.api.limits import (
    BACKLOG,
    BIND_RETRY_BASE_S,
    BIND_RETRY_MAX_S,
    HEAD_TIMEOUT_S,
    KEEP_ALIVE_S,
    MAX_CONNECTIONS,
    MAX_HEAD_BYTES,
    RESTARTS_PER_HOUR,
)
from reconciler.api.protocol import connection_cap, guarded_protocol, raise_nofile
from reconciler.api.refusals import Refusals, _RateLimit
from reconciler.base.errors import ReconcilerError
from reconciler.observe.loop_listener import holders_text


class LogBridge:
    """A ``logging.Handler`` for the libraries' own log records (uvicorn, asyncio, the MCP SDK): into the loop's log
    (escaped and redacted like every line), never raising. Installed on the root logger before the MCP server is
    built, so the SDK's rich console handler (which imports modules while handling an error, and so raised again
    when no descriptor was left) is never installed."""

    def __init__(self, log: Callable[..., None]):
        limit = _RateLimit(30)  # a client sending garbage makes uvicorn warn each time: the log is not its to fill

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    ok, suppressed = limit.take()
                    if not ok:
                        return
                    log(
                        "library-log",
                        logger=record.name,
                        level=record.levelname.lower(),
                        message=record.getMessage()[:500],
                        suppressed_before=suppressed,
                        **({"error": repr(record.exc_info[1])[:300]} if record.exc_info else {}),
                    )
                except Exception:  # noqa: BLE001 - a log record that cannot be written must not end its thread
                    self.handleError(record)

            def handleError(self, record: logging.LogRecord) -> None:
                return  # nowhere safer to report it than the log that just failed

        self.handler = _Handler(level=logging.WARNING)

    def install(self) -> None:
        root = logging.getLogger()
        if self.handler not in root.handlers:
            root.addHandler(self.handler)
        if root.level > logging.WARNING or root.level == logging.NOTSET:
            root.setLevel(logging.WARNING)


class Listener:
    """uvicorn serving ``app`` on an already bound socket, in a daemon thread, with an event loop whose errors are
    logged (``http-loop-error``, rate-limited) and never end it: an ``accept`` that fails for want of descriptors
    (EMFILE) is retried by asyncio a second later."""

    def __init__(
        self,
        app: Any,
        sock: socket.socket,
        *,
        log: Callable[..., None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.sock = sock
        self.log = log
        self.refusals: Refusals | None = getattr(app, "refusals", None)  # the Guard's: one account per listener
        tls = getattr(app, "tls", None)  # HTTPS with host.yaml's api.tls (reconciler.api.tls.TlsFiles), uvicorn's own
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            ws="none",
            # No limit_concurrency: uvicorn counts open connections in it, so idle ones would turn every scrape into
            # a 503. Connections are bounded by the protocol (``guarded_protocol``); the work of requests by the
            # worker threads (anyio's pool) that run the service calls.
            timeout_graceful_shutdown=3,
            timeout_keep_alive=int(KEEP_ALIVE_S),
            backlog=BACKLOG,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            http=guarded_protocol(
                max_connections=max_connections, head_timeout_s=HEAD_TIMEOUT_S, refusals=self.refusals
            ),
            ssl_certfile=tls.cert if tls is not None else None,
            ssl_keyfile=tls.key if tls is not None else None,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self.error: BaseException | None = None
        self.stopping = False
        self._errors = _RateLimit(5)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        try:
            exc = context.get("exception")
            ok, suppressed = self._errors.take()
            if not ok or self.log is None:
                return
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
                self.log(
                    "http-accept-failed",
                    error=exc.strerror or str(exc),
                    suppressed_before=suppressed,
                    action=f"new connections wait a second; idle ones are closed after {HEAD_TIMEOUT_S:.0f} s",
                )
            else:
                self.log(
                    "http-loop-error",
                    message=str(context.get("message", ""))[:300],
                    error=repr(exc)[:300] if exc else "-",
                    suppressed_before=suppressed,
                )
        except Exception:  # noqa: BLE001 - asyncio's handler of last resort: raising here ended the listener
            return

    async def _main(self) -> None:
        asyncio.get_running_loop().set_exception_handler(self._loop_error)
        await self.server.serve(sockets=[self.sock])

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by start() and by the supervisor
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
        self.stopping = True
        self.server.should_exit = True
        self.thread.join(timeout=5)
        if self.refusals is not None:
            self.refusals.flush()
        with contextlib.suppress(OSError):
            self.sock.close()


class Supervisor:
    """The listener of ``reconciler run``, kept serving: a listener whose thread ends while the loop runs is logged
    (``http-listener-died``), counted (``on_restart``) and started again on the same address with a fresh app; past
    ``RESTARTS_PER_HOUR`` restarts ``on_fatal`` is called (the loop then exits 1, for systemd to restart it).

    An address another process holds (EADDRINUSE: a local user who bound the port while the loop was down, at start
    or in the gap of a restart) never ends the loop: it keeps reconciling without its listener and binds again with
    backoff (``BIND_RETRY_BASE_S`` doubling up to ``BIND_RETRY_MAX_S``), each attempt logged
    (``http-listener-unbound``, naming who holds the port) and published through ``on_state`` (the loop's state,
    ``status`` and systemd's STATUS), until the address is free (``http-listener-bound``)."""

    def __init__(
        self,
        make_app: Callable[[int], Any],
        host: str,
        port: int,
        *,
        log: Callable[..., None],
        on_restart: Callable[[], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
        on_state: Callable[[dict[str, Any]], None] | None = None,
        check_every_s: float = 1.0,
        retry_base_s: float = BIND_RETRY_BASE_S,
        retry_max_s: float = BIND_RETRY_MAX_S,
    ):
        self.make_app = make_app
        self.host = host
        self.port = port
        self.log = log
        self.on_restart = on_restart
        self.on_fatal = on_fatal
        self.on_state = on_state
        self.check_every_s = check_every_s
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self._stop = threading.Event()
        self._restarts: list[float] = []
        self._watching = False
        self._unbound_since: float | None = None
        LogBridge(log).install()
        self.max_connections = connection_cap(raise_nofile(log))
        self.listener: Listener | None = None
        try:
            sock = bind(host, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            self._unbound(exc, attempt=1, retry_in_s=retry_base_s)
            return
        try:
            self.listener = Listener(
                make_app(sock.getsockname()[1]), sock, log=log, max_connections=self.max_connections
            )
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]

    @property
    def addr(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def bound(self) -> bool:
        return self.listener is not None

    def start(self) -> Supervisor:
        if self.listener is not None:
            self.listener.start()
            self._publish({"bound": True})
        self._watching = True
        threading.Thread(target=self._watch, name="http-watch", daemon=True).start()
        return self

    def _publish(self, state: dict[str, Any]) -> None:
        if self.on_state is not None:
            self.on_state({"addr": self.addr, **state})

    def _unbound(self, exc: OSError, *, attempt: int, retry_in_s: float) -> None:
        """Say that the address is held by another process: the log (who holds it), the loop's state."""
        if self._unbound_since is None:
            self._unbound_since = time.time()
        holder = holders_text(self.host, self.port)
        why = exc.strerror or str(exc)
        self.log(
            "http-listener-unbound",
            addr=self.addr,
            error=why,
            holder=holder or "-",
            attempt=attempt,
            retry_in_s=round(retry_in_s, 1),
            action="reconciling without the listener (no /metrics, /healthz, API or page) and binding again",
        )
        self._publish(
            {
                "bound": False,
                "error": why,
                "holder": holder,
                "since": self._unbound_since,
                "attempts": attempt,
                "retry_in_s": round(retry_in_s, 1),
            }
        )

    def _bind_and_start(self) -> None:
        sock = bind(self.host, self.port)
        try:
            listener = Listener(self.make_app(self.port), sock, log=self.log, max_connections=self.max_connections)
        except BaseException:
            sock.close()
            raise
        self.listener = listener.start()

    def _wait(self, seconds: float) -> None:
        """tenacity's sleep between two binds: a stop ends it."""
        self._stop.wait(seconds)

    def _bind_until_free(self, first_attempt: int) -> bool:
        """Bind the address again, with backoff while another process holds it (tenacity: only EADDRINUSE is
        retried); True once the listener serves, False when the loop stops meanwhile or the bind fails otherwise
        (``on_fatal`` then called)."""
        # tenacity: `reconciler run` alone binds (the start-up budget of the other commands)
        from tenacity import Retrying, retry_if_exception, stop_when_event_set, wait_exponential

        def still_unbound(state: Any) -> None:
            exc = state.outcome.exception()
            self._unbound(exc, attempt=first_attempt + state.attempt_number, retry_in_s=state.next_action.sleep)

        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, OSError) and e.errno == errno.EADDRINUSE),
            wait=wait_exponential(multiplier=self.retry_base_s, max=self.retry_max_s),
            stop=stop_when_event_set(self._stop),
            sleep=self._wait,
            before_sleep=still_unbound,
            reraise=True,
        )
        if self._stop.wait(self.retry_base_s):
            return False
        try:
            retrying(self._bind_and_start)
        except (OSError, ReconcilerError) as exc:
            if self._stop.is_set():
                return False
            self.log(
                "http-listener-died", error=str(exc)[:300], action="giving up: exiting 1 for the supervisor to restart"
            )
            if self.on_fatal:
                self.on_fatal(str(exc))
            return False
        self.log(
            "http-listener-bound",
            addr=self.addr,
            unbound_s=round(time.time() - (self._unbound_since or time.time()), 1),
        )
        self._unbound_since = None
        self._publish({"bound": True})
        return True

    def _watch(self) -> None:
        try:
            if self.listener is None and not self._bind_until_free(first_attempt=1):
                return
            self._keep_serving()
        finally:
            self._watching = False

    def _keep_serving(self) -> None:
        while not self._stop.wait(self.check_every_s):
            current = self.listener
            if current is None or current.thread.is_alive() or current.stopping:
                continue
            why = repr(current.error)[:300] if current.error else "its thread ended"
            now = time.monotonic()
            self._restarts = [t for t in self._restarts if now - t < 3600] + [now]
            if len(self._restarts) > RESTARTS_PER_HOUR:
                self.log("http-listener-died", error=why, action="giving up: exiting 1 for the supervisor to restart")
                if self.on_fatal:
                    self.on_fatal(why)
                return
            self.log("http-listener-died", error=why, action="starting it again", restarts=len(self._restarts))
            if self.on_restart:
                self.on_restart()
            with contextlib.suppress(OSError):
                current.sock.close()
            try:
                self._bind_and_start()
                self.log("http-listener-restarted", port=self.port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    self._give_up(exc)
                    return
                # Taken in the gap: another process bound the address before the listener could again.
                self.listener = None
                self._unbound(exc, attempt=1, retry_in_s=self.retry_base_s)
                if not self._bind_until_free(first_attempt=1):
                    return
            except ReconcilerError as exc:
                self._give_up(exc)
                return

    def _give_up(self, exc: BaseException) -> None:
        self.log(
            "http-listener-died", error=str(exc)[:300], action="giving up: exiting 1 for the supervisor to restart"
        )
        if self.on_fatal:
            self.on_fatal(str(exc))

    def alive(self) -> bool:
        """Serving, or waiting to bind again while another process holds the address (the loop is well: it
        reconciles, and says the listener is unbound)."""
        if self.listener is None:
            return self._watching
        return self.listener.thread.is_alive()

    def shutdown(self) -> None:
        self._stop.set()
        if self.listener is not None:
            self.listener.shutdown()
