"""``reconciler run``: its options; the command, which builds the loop with the front-ends it hosts and runs it until
a signal, is ``reconciler.cli.commands.run``'s, loaded when it runs. Registered by ``reconciler.cli``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from reconciler.cli.common import Command


def add_commands(
    sub: Any, *, parents: list[argparse.ArgumentParser], command_parser: Callable[[], argparse.ArgumentParser]
) -> None:
    """Register ``run``; ``command_parser`` builds the parser of the commands its loop answers for a client."""
    p = sub.add_parser(
        "run",
        parents=parents,
        help="the loop: watch and converge; serve /metrics, /healthz, the HTTP API (/v1) and MCP (/mcp)",
        epilog="Signals: SIGHUP looks again now (a pass, as an edit does); SIGTERM or SIGINT ends the loop once the "
        "action in flight has finished or been abandoned safely. The lanes keep running when the loop stops: it "
        "never stops a lane on its own exit (to stop them, assign nothing and apply).",
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1:9464",
        help="HOST:PORT for /metrics, /healthz, /v1 and /mcp ('' = off); loopback unless --api-allow-remote "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--api-token-file",
        metavar="FILE",
        help="the bearer token of /v1 and /mcp (a 0600 file; default $RECONCILER_API_TOKEN, else one "
        "generated into $RECONCILER_STATE_DIR/HOST/api-token)",
    )
    p.add_argument(
        "--api-allow-remote",
        action="store_true",
        help="allow a non-loopback --metrics-addr (needs --api-token-file or $RECONCILER_API_TOKEN)",
    )
    p.add_argument(
        "--api-host",
        metavar="NAME",
        action="append",
        default=[],
        help="a name clients reach the listener by (its Host header), besides its address; repeatable. "
        "Any other name is refused (421), against DNS rebinding",
    )
    p.add_argument(
        "--resync",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="look again at least this often (default: %(default)g)",
    )
    p.add_argument(
        "--debounce",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="quiet time after a file event (default: %(default)g)",
    )
    p.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="one line per event (default: %(default)s)"
    )
    p.add_argument(
        "--backoff-base",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="first delay after a failed enter (default: %(default)g)",
    )
    p.add_argument(
        "--backoff-max",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="longest delay between enters (default: %(default)g)",
    )
    p.set_defaults(func=Command("run", "cmd_run"), command_parser=command_parser)
