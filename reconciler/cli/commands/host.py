"""The service a command stands on (``reconciler.service.HostService``), for the handlers of
``reconciler.cli.commands``: loaded with the first of them that reads or changes the host.
"""

from __future__ import annotations

import argparse
import os

from reconciler.service import HostService, user_caller


def service(args: argparse.Namespace) -> HostService:
    """The service for this command. Inside a running loop (``reconciler.control``) it carries the loop's pass
    lock and action hooks, like the loop's HTTP API: destructive calls then wait for a pass to end rather than
    meeting the host lock the loop holds."""
    # The user: the peer's on the loop's socket (its SO_PEERCRED uid, and the SUDO_USER it came with), else ours.
    peer = getattr(args, "peer", None) or {"uid": os.getuid(), "sudo_user": os.environ.get("SUDO_USER") or ""}
    caller = user_caller("cli", uid=peer["uid"], sudo_user=peer["sudo_user"])
    return HostService(args.root, caller=caller, **getattr(args, "serve", {}))
