"""What the loop hosts, as controller-runtime's manager hosts its runnables: a ``FrontEnd`` (the HTTP listener, the
control socket) is handed to ``reconciler.loop.Loop``, which starts each once it holds the host lock, in the order
given, and closes them in reverse order when it ends; ``Hosting`` is what the loop lends each when it starts it.
The loop builds none of them and imports none of their modules: the command line's ``run``
(``reconciler.cli.run``) builds them and hands them in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from reconciler.apply.results import Outcome
    from reconciler.loop.log import Log
    from reconciler.loop.metrics import Metrics
    from reconciler.loop.runtime import FairLock
    from reconciler.model import ApiConfig


@dataclass(frozen=True)
class Hosting:
    """The loop, as a front-end it hosts sees it.

    ``host``: the host's name; ``pass_lock``: held for each pass (a destructive call takes it too); ``cancel``: set
    when the loop stops (an action in flight stops at a safe point); ``health``: ``/healthz``'s answer;
    ``on_outcome``, ``on_reclaim``, ``on_shm_reclaim``: count an action, a guarded reclaim's refusals, a confirmed
    ``shm reclaim`` of a front-end in the loop's metrics; ``fatal``: the front-end cannot go on, the loop ends with
    exit 1 (its supervisor restarts it); ``wake``: look again now, for a reason (a front-end's sync took a
    commit); ``api``: host.yaml's ``api`` section as the loop started (its listener's TLS)."""

    root: str
    host: str
    log: Log
    metrics: Metrics
    pass_lock: FairLock
    cancel: threading.Event
    health: Callable[[], tuple[int, dict[str, Any]]]
    on_outcome: Callable[[Outcome], None]
    on_reclaim: Callable[[Any], None]
    on_shm_reclaim: Callable[[Any], None]
    fatal: Callable[[str], None]
    wake: Callable[[str], None] = lambda _reason: None
    api: ApiConfig | None = None


class FrontEnd(Protocol):
    """A server the loop hosts."""

    def start(self, hosting: Hosting) -> None:
        """Start serving; a ``ReconcilerError`` here ends the loop before its first pass (exit 1)."""
        ...

    def alive(self) -> bool:
        """For the systemd watchdog: whether it still serves."""
        ...

    def close(self) -> None:
        """Stop serving (called once, if ``start`` returned)."""
        ...
