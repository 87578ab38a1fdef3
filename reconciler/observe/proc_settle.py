"""The holder scan's listings of /proc: when the reads of one more are needed, and when the scan is complete
(docs/design.md, safety rule 2). Pure over the reads it is handed: ``holder_scan.scan_holders`` passes /proc's, the
simulation its world's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconciler.observe.procfs import HolderScan

# How many listings of /proc one scan takes at most before it gives up as incomplete (fail closed, rule 3). A
# listing after the first reads only the processes born since the one before (a few, in a few milliseconds).
MAX_SCAN_ROUNDS = 16


def settle_scan(
    scan: HolderScan,
    *,
    list_pids: Callable[[], list[str]],
    start_time: Callable[[int], int | None],
    scan_names: Callable[[list[str], HolderScan], None],
    max_rounds: int = MAX_SCAN_ROUNDS,
) -> HolderScan:
    """List /proc again while a listing lost a process (docs/design.md, safety rule 2).

    A holder can hand its mapping down by fork and exit (a daemonising double fork, a prefork recycler): gone when
    its pid is read, its child born after the listing. So /proc is listed again after the first listing, each
    further listing reads every process not read yet (a new pid, or one whose start time changed: a reused number),
    and another follows while a listing lost one: listed, then gone before it was read, or read with its memory gone
    (``HolderScan.lost``). A listing whose processes were all read ends the scan, however many new ones it showed
    (a build forking hundreds a second): what a process born since holds came from an ancestor read alive, or was
    mapped after that read, which the second inspection and the write lease catch (rule 4). A chain handing down
    faster than a listing is read leaves the scan ``unstable`` after ``max_rounds`` listings: incomplete, so the
    caller refuses (rule 3). ``list_pids``, ``start_time`` and ``scan_names`` are the reads.
    """
    lost = True  # what the first listing's reads lost is not known here: list again in any case
    while lost:
        fresh: list[str] = []
        lost = False
        for name in list_pids():
            pid = int(name)
            now = start_time(pid)
            if now is None:
                # Listed, and gone before it was ever read (once: a pid listed while it exits stays listed a moment).
                if pid not in scan.seen and pid not in scan.lost:
                    scan.lost.append(pid)
                    lost = True
            elif now != scan.seen.get(pid):
                fresh.append(name)
        if not fresh and not lost:
            return scan
        if scan.rounds >= max_rounds:
            scan.unstable = (
                f"processes listed in /proc kept vanishing before they were read ({len(fresh)} new, and some gone "
                f"unread, after {scan.rounds} listings): a holder handed down by fork cannot be ruled out"
            )
            return scan
        scan.rounds += 1
        before = len(scan.lost)
        scan_names(fresh, scan)
        lost = lost or len(scan.lost) > before
    return scan
