"""The front-ends ``reconciler run`` hosts in its loop (``reconciler.loop.hosting``), as controller-runtime's manager
is given its runnables by the program's entry: ``HttpFrontEnd``, the one listener for ``/metrics``, ``/healthz``,
the HTTP API (``/v1``) and MCP (``/mcp``) (``reconciler.api``), and ``ControlFrontEnd``, the socket on which the loop
answers the command line (``reconciler.control.server``), whose commands ``CommandRunner`` runs with the command
line's own ``run_command``. Built by ``reconciler.cli.run``: the one module that wires the loop to its servers, so
the loop, the API and the control server import none of each other.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from typing import Any

from reconciler.api import Supervisor, build_app, check_exposure, check_tls, resolve_tokens, split_addr
from reconciler.base.errors import ReconcilerError
from reconciler.cli.common import LOOP_COMMANDS, Console, command_name, report_error, run_command
from reconciler.control.server import Client, ControlServer
from reconciler.loop.hosting import Hosting
from reconciler.loop.runtime import PassGate
from reconciler.service import ActionHooks


class MetricsAddrUnusable(ReconcilerError):
    """``--metrics-addr`` cannot be listened on (not a local address, not HOST:PORT; one in use is bound again
    with backoff, never this error)."""

    code = "metrics_addr_unusable"


def _hooks(hosting: Hosting) -> ActionHooks:
    """What the loop counts of the actions a front-end takes in its process."""
    return ActionHooks(hosting.on_outcome, hosting.on_reclaim, hosting.on_shm_reclaim, wake=hosting.wake)


class HttpFrontEnd:
    """One listener on ``--metrics-addr`` for /metrics, /healthz, the API (/v1) and MCP (/mcp); none with ''."""

    def __init__(
        self,
        metrics_addr: str | None,
        *,
        api_token_file: str | None = None,
        api_allow_remote: bool = False,
        api_hosts: tuple[str, ...] = (),
    ):
        self.metrics_addr = metrics_addr
        self.api_token_file = api_token_file
        self.api_allow_remote = api_allow_remote
        self.api_hosts = tuple(api_hosts)  # names the listener answers to besides its address (--api-host)
        self._http: Supervisor | None = None

    def start(self, hosting: Hosting) -> None:
        if not self.metrics_addr:
            return
        try:
            host, port = split_addr(self.metrics_addr)
        except (ValueError, OverflowError) as exc:
            raise MetricsAddrUnusable(
                f"cannot serve /metrics on {self.metrics_addr}: {exc}; give --metrics-addr as "
                "HOST:PORT on this machine, or '' to serve nothing"
            ) from None
        name = hosting.host
        tokens = resolve_tokens(name, token_file=self.api_token_file)
        api = hosting.api
        tls = check_tls(api.tls.cert, api.tls.key) if api is not None and api.tls is not None else None
        insecure = api is not None and api.insecure
        check_exposure(
            host, allow_remote=self.api_allow_remote, token=tokens.full, tls=tls is not None, insecure=insecure
        )
        hooks = _hooks(hosting)

        def make_app(bound_port: int) -> Any:
            return build_app(
                hosting.root,
                tokens=tokens,
                pass_lock=hosting.pass_lock,
                bind_host=host,
                port=bound_port,
                api_hosts=self.api_hosts,
                host=name,
                log=hosting.log,
                metrics=hosting.metrics.render,
                health=hosting.health,
                cancel=hosting.cancel,
                hooks=hooks,
                on_refusal=hosting.metrics.record_http_refusal,
                on_drop=hosting.metrics.record_http_drop,
                tls=tls,
                on_verdict=hosting.metrics.set_verdict,
            )

        try:
            # An address another process holds is no error here: the supervisor binds it again with backoff while
            # the loop reconciles (it says so in the log, the loop's state and systemd's STATUS).
            self._http = Supervisor(
                make_app,
                host,
                port,
                log=hosting.log,
                on_restart=hosting.metrics.record_listener_restart,
                on_fatal=hosting.fatal,
                on_state=lambda state: hosting.publish("listener", state),
            ).start()
        except (OSError, OverflowError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise MetricsAddrUnusable(
                f"cannot serve /metrics on {self.metrics_addr}: {why}; give --metrics-addr as HOST:PORT on this "
                "machine, or '' to serve nothing"
            ) from None
        scheme = "https" if tls is not None else "http"
        base = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{self._http.port}"
        bound = {} if self._http.bound else {"bound": False}
        hosting.log("metrics", addr=f"{base}/metrics", **bound)
        hosting.log(
            "api",
            addr=f"{base}/v1",
            mcp=f"{base}/mcp",
            token_from=tokens.full.describe(),
            caller=tokens.full.name,
            read_token_from=tokens.read.describe() if tokens.read is not None else "-",
            max_connections=self._http.max_connections,
            **bound,
        )

    def alive(self) -> bool:
        return self._http is None or bool(self._http.alive())

    def close(self) -> None:
        if self._http:
            self._http.shutdown()


class CommandRunner:
    """Runs the commands of the command line a running loop answers for its clients (``reconciler.control.server``
    parses and runs nothing itself): parsed by the command line's own parser, run by ``run_command`` with the
    client's console, as the client would run them stand-alone."""

    def __init__(self, build_parser: Callable[[], argparse.ArgumentParser]):
        self.build_parser = build_parser  # the command line's (``reconciler.cli.build_parser``)
        self._parser: argparse.ArgumentParser | None = None
        self._parser_lock = threading.Lock()

    def parse(self, argv: list[str], root: str) -> tuple[argparse.Namespace | None, str]:
        with self._parser_lock:
            if self._parser is None:
                self._parser = self.build_parser()
            try:
                args = self._parser.parse_args(argv)
            except SystemExit:
                return None, "arguments this loop does not take"
        if command_name(args) not in LOOP_COMMANDS:
            return None, f"{command_name(args)} runs stand-alone"
        args.root = root
        return args, ""

    def run(self, command: argparse.Namespace, client: Client) -> int:
        command.console = Console(
            client.out,
            client.err,
            stdin_tty=client.stdin_tty,
            no_color=client.no_color,
            ask=client.ask,
            local=False,
            cancel=client.cancel,
        )
        command.peer = client.peer
        command.serve = client.serve
        return run_command(command)

    def fail(self, command: argparse.Namespace, code: str, message: str) -> None:
        report_error(command, code, message)


class ControlFrontEnd:
    """The socket on which the loop answers the command line's commands; what they change is counted and
    serialised like the HTTP API's calls."""

    def __init__(self, runner: CommandRunner):
        self.runner = runner
        self._server: ControlServer | None = None

    def start(self, hosting: Hosting) -> None:
        hooks = _hooks(hosting)
        self._server = ControlServer(
            hosting.root,
            hosting.host,
            runner=self.runner,
            stop=hosting.cancel,
            log=hosting.log,
            serve=lambda: {"pass_lock": PassGate(hosting.pass_lock, hosting.log, "cli"), "hooks": hooks},
        ).start()

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
