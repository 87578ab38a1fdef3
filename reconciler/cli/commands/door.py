"""The handler of ``reconciler door`` (registered by ``reconciler.cli``): the front door, with its ASGI stack and
HTTP client, loaded for this command alone."""

from __future__ import annotations

import argparse

from reconciler.door.run import serve


def cmd_door(args: argparse.Namespace) -> int:
    """The front door, until SIGTERM or SIGINT."""
    return serve(args.root, listen=args.listen, token_file=args.token_file)
