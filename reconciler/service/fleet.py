"""``reconciler fleet status --fleet FILE``: every host of a fleet read through its own loop's API (``GET
/v1/status`` with the host's token), in parallel, each within the fleet's ``timeout_s``, and shown side by side:
its verdict, its slots with what holds each (and which lanes sleep), free VRAM against the reserve, and its offload
tmpfs. A host that does not answer is shown as unreachable, with why, never guessed; a token is sent to its own host
only and never printed.

Each host stays a per-host agent (its own loop guards its own cards, tmpfs and processes): this only reads them.
Called by ``reconciler.cli.commands.fleet``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from reconciler.model.fleet import FleetFile
from reconciler.observe.fleet import HostRow, ask_host


@dataclass(frozen=True)
class FleetStatus:
    rows: tuple[HostRow, ...]

    @property
    def exit_code(self) -> int:
        """0 when every host answered, 1 when one did not (it is shown as unreachable)."""
        return 0 if all(r.reachable for r in self.rows) else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "hosts": [r.to_json() for r in self.rows],
            "unreachable": [r.name for r in self.rows if not r.reachable],
        }


def fleet_status(fleet: FleetFile, *, timeout_s: float | None = None) -> FleetStatus:
    timeout = timeout_s if timeout_s is not None else fleet.timeout_s
    with ThreadPoolExecutor(max_workers=min(16, len(fleet.hosts)), thread_name_prefix="fleet") as pool:
        rows = list(pool.map(lambda h: ask_host(h, timeout), fleet.hosts))
    return FleetStatus(tuple(rows))
