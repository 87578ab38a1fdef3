"""The handler of ``reconciler run`` (registered by ``reconciler.cli.run``): the loop built with the front-ends it
hosts (``reconciler.cli.front_ends``), run until a signal. Loaded when it runs: the parser registers the command for
``reconciler --help`` too, which loads none of the loop, the API, the model or the error classes.
"""

from __future__ import annotations

import argparse

from reconciler.base.errors import ReconcilerError
from reconciler.cli.common import EXIT_ERROR
from reconciler.cli.front_ends import CommandRunner, ControlFrontEnd, HttpFrontEnd
from reconciler.loop.backoff import Backoff
from reconciler.loop.log import Log
from reconciler.loop.loop import Loop


def cmd_run(args: argparse.Namespace) -> int:
    """``args.command_parser`` builds the parser of the commands the loop answers for a client."""
    log = Log(args.log_format)
    loop = Loop(
        args.root,
        resync_s=args.resync,
        debounce_s=args.debounce,
        log=log,
        backoff=Backoff(base_s=args.backoff_base, max_s=args.backoff_max),
        front_ends=[
            HttpFrontEnd(
                args.metrics_addr or None,
                api_token_file=args.api_token_file,
                api_allow_remote=args.api_allow_remote,
                api_hosts=tuple(args.api_host),
            ),
            ControlFrontEnd(CommandRunner(args.command_parser)),
        ],
    )
    try:
        return loop.run()
    except ReconcilerError as exc:
        # Before the loop could start (the host lock, the metrics address): one log line in the loop's own
        # format, so a supervisor reading JSON sees why, and exit 1 (never a traceback).
        log("exit", reason="cannot start", error=str(exc))
        return EXIT_ERROR
