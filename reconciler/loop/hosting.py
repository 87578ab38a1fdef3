"""What the loop hosts, as controller-runtime's manager hosts its runnables: a ``FrontEnd`` (the HTTP listener, the
control socket) is handed to ``reconciler.loop.Loop``, which starts each once it holds the host lock, in the order
given, and closes them in reverse order when it ends; ``Hosting`` is what the loop lends each when it starts it.
The loop builds none of them and imports none of their modules: the command line's ``run``
(``reconciler.cli.commands.run``) builds them and hands them in.
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
    commit); ``publish``: a front-end's own state under its name (the listener's: bound, or why not), into the
    loop's published state (``status``) and systemd's STATUS; ``api``: host.yaml's ``api`` section as the loop
    started (its listener's TLS)."""

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
    publish: Callable[[str, dict[str, Any]], None] = lambda _name, _state: None
    api: ApiConfig | None = None


def status_line(name: str, state: dict[str, Any]) -> str:
    """A front-end's published state in the words of systemd's STATUS (``systemctl status`` shows it)."""
    if state.get("bound", True):
        return f"{name} {state.get('addr', '')} serving"
    holder = f"; held by {state['holder']}" if state.get("holder") else ""
    return (
        f"{name} {state.get('addr', '')} not bound ({state.get('error', '?')}{holder}); reconciling without it, "
        f"binding again in {state.get('retry_in_s', '?')} s"
    )


class FrontEndStates:
    """What the front-ends published of themselves, by name (``Hosting.publish``): kept for the loop's published
    state (``status``: the listener bound, or why not)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, dict[str, Any]] = {}

    def set(self, name: str, state: dict[str, Any]) -> str:
        """Keep ``state``; its STATUS line."""
        with self._lock:
            self._states[name] = dict(state)
        return status_line(name, state)

    def to_json(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: dict(state) for name, state in self._states.items()}


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
