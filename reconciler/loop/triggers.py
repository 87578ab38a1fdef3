"""Why the loop looks again: ``Triggers`` (thread-safe reasons that wake it), the watch of manifests/ and
configs/ (``watch_files``) and the engine's event stream (``EngineEvents``). Made and started by
``reconciler.loop.Loop`` once it holds the host lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.host.engine.protocol import EVENT_ACTIONS
from reconciler.observe.containers import EngineObserver, EventFilter

# How long after a container's "die" event the loop looks again (the engine's list lags behind the event).
_DIE_SETTLE_S = 1.0
# The longest wait between two attempts to reach the engine's event stream while it does not answer: once it
# answers again, the loop looks again within this time (not only at the next resync).
_EVENTS_RETRY_MAX_S = 5.0


@dataclass
class Triggers:
    """Why the loop should look again. Thread-safe; any trigger wakes the loop."""

    wake: threading.Event = field(default_factory=threading.Event)
    reasons: set[str] = field(default_factory=set)
    fs_at: float = 0.0
    # How many file events so far: a pass's enter compares it at each health poll to learn, cheaply, that the files
    # may have changed since its pass loaded them (``Loop._still_wanted``).
    file_events: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fire(self, reason: str) -> None:
        with self.lock:
            self.reasons.add(reason)
            if reason == "file":
                self.fs_at = time.monotonic()
                self.file_events += 1
        self.wake.set()

    def take(self) -> tuple[set[str], float]:
        with self.lock:
            reasons, self.reasons = self.reasons, set()
            self.wake.clear()
            return reasons, self.fs_at


def watch_files(root: str, triggers: Triggers) -> Any:
    """Fire ``file`` on any change under ``root``'s manifests/ and configs/ (watchdog's observer, started: its
    ``stop`` ends it)."""
    # The optional SDK: watchdog is needed by `reconciler run` alone.
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            if event.event_type in ("opened", "closed_no_write"):
                return
            triggers.fire("file")

    obs = Observer()
    for sub in ("manifests", "configs"):
        path = Path(root) / sub
        if path.is_dir():
            obs.schedule(Handler(), str(path), recursive=True)
    obs.daemon = True
    obs.start()
    return obs


class EngineEvents:
    """The engine's container events, each relevant one a trigger; a stream that breaks is tried again (ever
    slower, up to ``_EVENTS_RETRY_MAX_S``), and a trigger fires when it is lost and when it answers again.

    ``observer``: the loop's observer of the engine now (None before the files first load); ``scope``: the event
    filter's view of this host; ``engine_down``: whether the last pass found the engine down."""

    def __init__(
        self,
        *,
        triggers: Triggers,
        log: Callable[..., None],
        stop: threading.Event,
        observer: Callable[[], EngineObserver | None],
        scope: Callable[[], tuple[str, frozenset[str] | None] | None],
        engine_down: Callable[[], bool],
    ):
        self.triggers = triggers
        self.log = log
        self.stop = stop
        self.observer = observer
        self.scope = scope
        self.engine_down = engine_down

    def start(self) -> None:
        threading.Thread(target=self.run, name="docker-events", daemon=True).start()

    def run(self) -> None:
        delay = 0.5
        lost = False
        while not self.stop.is_set():
            observer = self.observer()
            if observer is None:
                time.sleep(delay)
                continue
            # Only containers a plan reads wake the loop (ours, and any claiming a GPU or offload): on a shared
            # engine the events of everything else would otherwise cost a pass each.
            relevant = EventFilter(observer, self.scope)
            try:
                stream = observer.engine.events(actions=EVENT_ACTIONS)
                delay = 0.5
                if lost or self.engine_down():
                    # The engine answers again (it was down, or restarted, or down at the last pass while this
                    # thread had not yet tried it): whatever changed meanwhile sent no event this loop saw, so look
                    # again now rather than at the next resync.
                    lost = False
                    self.log("docker-events-resumed", url=observer.url)
                    self.triggers.fire("docker-reconnected")
                for ev in stream:
                    if self.stop.is_set():
                        return
                    action = ev.get("status") or ev.get("Action")
                    if not relevant.matters(ev):
                        continue
                    name = ((ev.get("Actor") or {}).get("Attributes") or {}).get("name", "")
                    self.log("docker-event", action=action, container=name or (ev.get("id") or "?")[:12])
                    self.triggers.fire(f"docker-{action}")
                    if action == "die":
                        # The engine sends "die" before its container list shows the container stopped (~50 ms
                        # on docker 20.10), so the pass this wakes may still see it running, and then nothing
                        # would look again until the resync. Look again once the engine has caught up.
                        later = threading.Timer(_DIE_SETTLE_S, self.triggers.fire, args=("docker-die-settled",))
                        later.daemon = True
                        later.start()
            except Exception as exc:  # noqa: BLE001 - the engine went away: retry, and the resync timer still runs
                if not self.stop.is_set() and not lost:
                    self.log("docker-events-lost", error=str(exc), retry="every few seconds until the engine answers")
                    self.triggers.fire("docker-events-lost")  # look again: the pass reports the engine down
                lost = True
                self.stop.wait(delay)
                delay = min(delay * 2, _EVENTS_RETRY_MAX_S)
