"""The loop's check, at each health poll of an enter, that an edit made meanwhile has not left its lane unwanted.

An enter waits up to its recipe's ``health.start_timeout_s``; a wrong recipe fixed a second later, or a switch to
another topology, would otherwise hold the slot dark for all of it. ``StillWanted`` is handed to each pass's applier
(``Applier.superseded``) by ``reconciler.loop.Loop.cycle``; the enter asks it (``reconciler.apply.enter``) and, when
it names a reason, abandons the enter as a failed one is left (stopped, kept for its logs), without a backoff, and
the pass ends so that the next one plans the new desired state. The judgement is pure
(``reconciler.plan.supersede``).
"""

from __future__ import annotations

import contextlib
import threading

from reconciler.apply.host_io import REAL_IO, HostIO
from reconciler.base.errors import ReconcilerError
from reconciler.load.desired import load_desired
from reconciler.loop.triggers import Triggers
from reconciler.model import DesiredState
from reconciler.plan.actions import Action
from reconciler.plan.supersede import superseded_by


class StillWanted:
    """Why an enter of this pass is no longer wanted, or None. Cheap while nothing changed: the counter of file
    events is compared, and the files are loaded again only after a new event, once per event. A broken edit changes
    nothing (safety rule 8): what was last loaded stays the judge. Called from a group's enter threads at once."""

    def __init__(self, root: str, desired: DesiredState, triggers: Triggers, edits: int, *, io: HostIO = REAL_IO):
        """``desired``: what the pass was planned from; ``edits``: the triggers' count of file events read before
        it was loaded."""
        self.root = root
        self.desired = desired
        self.triggers = triggers
        self.io = io
        self._seen = edits
        self._latest = desired
        self._lock = threading.Lock()

    def __call__(self, action: Action) -> str | None:
        with self._lock:
            edits = self.triggers.file_events
            if edits != self._seen:
                self._seen = edits
                # Invalid, or unreadable for now: what was loaded last stays; the next event looks again.
                with contextlib.suppress(ReconcilerError):
                    self._latest = load_desired(self.root, tmpfs=self.io.tmpfs)
            now = self._latest
        return superseded_by(action, self.desired, now)
