"""What the page shows, made once for every browser watching it (``Snapshot``): the host's status, its offload
files with their owners, the audit trail and the recipes, from the service layer, redacted, rendered into the
live part of the page (``live_html``) with an ETag.

A status costs about 10 ms of CPU (it observes the engine, /proc and the tmpfs); polled each second by each
browser it would keep the loop busy. So a snapshot is made again only when something says the host may have
changed: a pass ended (the loop's pass counter: whatever made the change, a pass that acted ends after it, however
quickly it ran between two polls), a pass or a call holds the pass lock (then each second, so the phases of a switch
show as they come) or stopped holding it, a file under configs/ or manifests/ or the tmpfs changed (a stat and a
listing), an action of this page moved on (``PageProgress``), or ``MAX_AGE_S`` passed (the figures that drift:
VRAM).

The snapshot's status is also what ``/healthz`` and ``/metrics`` take the verdict from (``Snapshot.verdict``): one
look at the host, made again by the same rule, for every view the listener serves.

Made by ``reconciler.api.page.handlers``; ``live_html`` is pure and measured by tests/bench/bench_page.py.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import reconciler.api.page.sections as sections
import reconciler.api.page.view as view
from reconciler import __version__
from reconciler.api.page.templates import Html, render
from reconciler.base.errors import ReconcilerError
from reconciler.base.redact import redact_data
from reconciler.plan.verdict import WORDS, Verdict
from reconciler.service import HostService
from reconciler.service.shm import ShmStatusResult

HISTORY_S = 3600.0  # free VRAM per card is kept this long, a sample a snapshot
MAX_AGE_S = 30.0  # a snapshot is made again at least this often while a browser watches (VRAM figures drift)
BUSY_EVERY_S = 1.0  # and this often while a pass (or a call) holds the pass lock
LISTED_AT_MOST = 4096  # tmpfs entries looked at for the change check


class PageProgress:
    """The phases of the actions this page's own apply runs, by lane (``Action.key``), for the lane cards: the
    apply layer's ``Progress``, which the page hands to the service's ``apply_saved``."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, Any]] = {}
        self.version = 0
        self._lock = threading.Lock()

    def phase(self, action: Any, phase: str, *, elapsed: float = 0.0, timeout: float | None = None) -> None:
        with self._lock:
            self.phases[action.key] = {
                "kind": action.kind.value,
                "phase": phase.split(":", 1)[0].strip(),
                "detail": phase,
                "elapsed": elapsed,
                "timeout": timeout,
            }
            self.version += 1

    def done(self, action: Any, result: str, seconds: float, detail: str) -> None:
        with self._lock:
            self.phases.pop(action.key, None)
            self.version += 1

    def current(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self.phases)


@dataclass(frozen=True)
class PageData:
    """One snapshot's values, redacted: what ``live_html`` renders."""

    status: dict[str, Any]
    files: list[dict[str, Any]]
    audit: list[dict[str, Any]]
    health: dict[str, Any] | None
    recipes: dict[str, dict[str, Any]]
    progress: dict[str, dict[str, Any]]
    busy: bool = False
    topology: str | None = None
    topologies: tuple[str, ...] = ()
    vram_history: dict[str, list[tuple[float, int]]] = field(default_factory=dict)


def live_html(d: PageData) -> Html:
    """The live part of the page: header, slots, lanes, the front door (when one runs), plan, tmpfs, audit trail."""
    plan = d.status.get("plan") or {}
    shm = d.status.get("shm") or {}
    orphans = ((shm.get("files") or {}).get("orphan") or {}).get("count", 0)
    return render(
        "live.html",
        header=view.header(d.status, d.health, version=__version__),
        slots=view.slot_cards(d.status, d.vram_history),
        lanes=view.lane_cards(d.status, d.recipes, d.progress),
        kept=view.kept_section(d.status),
        door=sections.door_section(d.status.get("door")),
        changes="true" if plan.get("changes") else "false",
        blocked="true" if plan.get("blocked") else "false",
        plan=sections.plan_section(plan, d.status.get("aliases") or ()),
        orphans=orphans,
        shm=sections.shm_section(shm, d.files),
        audit=sections.audit_section(d.audit),
    )


def _short_image(image: str) -> str:
    name, sep, digest = image.partition("@")
    return f"{name}@{digest[:19]}" if sep else image


def page_data(
    service: HostService,
    *,
    health: dict[str, Any] | None,
    progress: dict[str, dict[str, Any]],
    busy: bool,
) -> PageData:
    """The service's answers for one snapshot, each through the redaction boundary."""
    res = service.status()
    status = redact_data(res.to_json())
    files = redact_data(ShmStatusResult(res.observed.shm).to_json()).get("files") or []
    try:
        audit = service.audit(since=time.time() - 7 * 86400).records
    except ReconcilerError:
        audit = []
    recipes: dict[str, dict[str, Any]] = {}
    topology: str | None = None
    topologies: tuple[str, ...] = ()
    try:
        desired = service.desired()
    except ReconcilerError:
        desired = None
    if desired is not None:
        for name, r in desired.recipes.items():
            model = r.model.id + (f"@{r.model.revision}" if r.model.revision else "")
            recipes[name] = {"model": model, "image": _short_image(r.container.image)}
        topology, topologies = desired.topology, tuple(sorted(desired.topologies))
    return PageData(
        status=status,
        files=files,
        audit=redact_data(audit[-sections.AUDIT_SHOWN :]),
        health=redact_data(health) if health is not None else None,
        recipes=redact_data(recipes),
        progress=redact_data(progress),
        busy=busy,
        topology=topology,
        topologies=tuple(t for t in topologies if t),
    )


class Snapshot:
    """The live part of the page, made again only when something may have changed (see the module's docstring);
    one at a time, shared by every browser."""

    def __init__(
        self,
        root: str,
        service: Callable[[], HostService],
        *,
        health: Callable[[], tuple[int, dict[str, Any]]] | None = None,
        busy: Callable[[], bool] | None = None,
        progress: PageProgress | None = None,
        max_age_s: float = MAX_AGE_S,
    ):
        self.root = Path(root)
        self.service = service
        self.health = health
        self.busy = busy or (lambda: False)
        self.progress = progress or PageProgress()
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._made = 0.0
        self._sig: tuple[Any, ...] | None = None
        self.data: PageData | None = None
        self.html = Html("")
        self.etag = ""
        self.made_count = 0
        self._vram: dict[str, deque[tuple[float, int]]] = {}

    def _remember_vram(self, status: dict[str, Any]) -> dict[str, list[tuple[float, int]]]:
        """Each card's free VRAM of this snapshot added to its last hour (in the loop's memory, a sample a snapshot:
        every ``MAX_AGE_S`` at least while a browser watches, each second while a pass runs)."""
        now = time.time()
        for slot, s in (status.get("slots") or {}).items():
            free = s.get("memory_free_bytes")
            if isinstance(free, int) and not isinstance(free, bool):
                points = self._vram.setdefault(slot, deque())
                points.append((now, free))
                while points and now - points[0][0] > HISTORY_S:
                    points.popleft()
        return {slot: list(points) for slot, points in self._vram.items()}

    def _health(self) -> dict[str, Any] | None:
        return self.health()[1] if self.health is not None else None

    def _signature(self, health: dict[str, Any] | None, busy: bool) -> tuple[Any, ...]:
        # The pass counter, not the last pass's result: a pass that acted may begin and end between two polls (a
        # switch of sleeping lanes takes well under a second), and its result ("converged") is the one before it.
        # ``busy`` alone is seen only by a poll that falls inside the pass. A pass that changed nothing costs one
        # status more: passes come on a change, an engine event of this host's containers or the resync timer.
        h = health or {}
        sig: list[Any] = [h.get("passes"), (h.get("last_pass") or {}).get("result"), h.get("files"), busy]
        sig.append(self.progress.version)
        for d in (self.root / "configs", self.root / "configs" / "recipes", self.root / "manifests"):
            sig.append(_mtimes(d))
        shm_dir = ((self.data.status.get("shm") or {}).get("dir") if self.data else None) or ""
        if shm_dir:
            sig.append(_listing(shm_dir))
        return tuple(sig)

    def current(self) -> tuple[str, Html]:
        """The ETag and the markup of the live part, made again if something may have changed."""
        with self._lock:
            now = time.monotonic()
            health = self._health()
            busy = self.busy()
            sig = self._signature(health, busy)
            due = (
                self.data is None
                or sig != self._sig
                or now - self._made >= self.max_age_s
                or (busy and now - self._made >= BUSY_EVERY_S)
            )
            if due:
                data = page_data(self.service(), health=health, progress=self.progress.current(), busy=busy)
                self.data = replace(data, vram_history=self._remember_vram(data.status))
                self.html = live_html(self.data)
                self.etag = hashlib.sha256(self.html.encode()).hexdigest()[:20]
                self._made = now
                self._sig = self._signature(health, busy)  # with the tmpfs dir the snapshot names
                self.made_count += 1
            return self.etag, self.html

    def verdict(self) -> Verdict | None:
        """The verdict of the host as this snapshot sees it, made again first if something may have changed (the
        one every view gives: ``/healthz`` and ``/metrics`` take it here); None where no status can be made (a
        host file that does not validate, which the loop's own health says)."""
        try:
            self.current()
        except ReconcilerError:
            return None
        data = self.data
        v = (data.status.get("verdict") if data else None) or {}
        if not isinstance(v, dict) or v.get("word") not in WORDS:
            return None
        return Verdict(str(v["word"]), str(v.get("reason") or ""))


def _mtimes(d: Path) -> tuple[Any, ...]:
    try:
        with os.scandir(d) as it:
            return (os.stat(d).st_mtime_ns, *sorted((e.name, e.stat().st_mtime_ns) for e in it if e.is_file()))
    except OSError:
        return ()


def _listing(d: str) -> tuple[Any, ...]:
    out = []
    try:
        with os.scandir(d) as it:
            for i, e in enumerate(it):
                if i >= LISTED_AT_MOST:
                    break
                st = e.stat(follow_symlinks=False)
                out.append((e.name, st.st_ino, st.st_size, st.st_blocks))
    except OSError:
        return ()
    return tuple(sorted(out))
