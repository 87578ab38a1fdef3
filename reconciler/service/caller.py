"""Who asks (the caller every audit record names), and the audit query's time bound.

``Caller`` is made by each front-end (the command line with ``user_caller``, the HTTP API from its token, MCP) and
given to ``reconciler.service.host_service.HostService``, which writes it into each record of the audit trail
(``reconciler.store.audit``); ``parse_since`` reads the ``since`` of ``reconciler audit`` and ``GET /v1/audit``.
"""

from __future__ import annotations

import contextlib
import pwd
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Caller:
    """Who asks: the front-end (``cli``, ``api``, ``mcp``, ``loop``) and, over the API, the token's name; on the
    command line the user (``who``: ``root``, or ``root (sudo from alice)``), with ``uid`` and ``sudo_user``."""

    front: str
    who: str = ""
    uid: int | None = None
    sudo_user: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"front": self.front, "who": self.who}
        if self.uid is not None:
            data["uid"] = self.uid
        if self.sudo_user:
            data["sudo_user"] = self.sudo_user
        return data


def user_caller(front: str, *, uid: int, sudo_user: str = "") -> Caller:
    """The caller a command-line user is: the name of ``uid`` (the uid itself where it has none) and, run through
    sudo, whose sudo it was."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    who = f"{name} (sudo from {sudo_user})" if sudo_user else name
    return Caller(front, who, uid=uid, sudo_user=sudo_user)


SINCE_HELP = "give an age (90s, 15m, 2h, 7d), an ISO time (2026-11-30T18:00) or epoch seconds"


def parse_since(text: str | None) -> float | None:
    """The audit query's ``since`` as every front-end takes it: epoch seconds, an ISO time, or an age (90s, 15m, 2h,
    7d). None for no bound; ValueError (with ``SINCE_HELP``) for anything else."""
    if not text:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(text[:-1]) * units[text[-1]]
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(SINCE_HELP) from None
