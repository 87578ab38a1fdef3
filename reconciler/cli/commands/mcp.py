"""The handler of ``reconciler mcp`` (registered by ``reconciler.cli``): the MCP server on stdio, with its SDK,
loaded for this command alone."""

from __future__ import annotations

import argparse

from reconciler.mcp_server import serve_stdio


def cmd_mcp(args: argparse.Namespace) -> int:
    """The MCP server over stdin/stdout, for the client that starts it (no token: that client owns the process)."""
    return serve_stdio(args.root)
