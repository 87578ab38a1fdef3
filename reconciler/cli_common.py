"""What every command-line module shares: exit codes, the redacting JSON writer, the service for a command.

Imported by ``reconciler.cli`` (the parser and the read-only commands), ``reconciler.cli_apply`` and
``reconciler.cli_shm``; it imports none of them, so the command-line modules never import each other.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reconciler.service import HostService

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_BLOCKED = 3


def emit_json(data: Any) -> None:
    from reconciler.redact import redact_json

    # A last pass over every string on its way out: a command line missed at its source is masked here.
    sys.stdout.write(redact_json(data, indent=2, sort_keys=False, default=str) + "\n")


def service(args: argparse.Namespace) -> HostService:
    from reconciler.service import Caller, HostService

    return HostService(args.root, caller=Caller("cli"))
