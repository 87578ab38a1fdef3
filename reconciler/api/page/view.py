"""The live part of the page from the service's answers: the header (the loop's verdict in words and colour, the
last pass, the sources), a card per GPU slot and a card per lane, each with its stable hooks (``data-verdict``,
``data-slot``/``data-state``, ``data-lane``/``data-phase``).

Pure: plain values in (``status --json`` and the loop's health, redacted by the caller), markup out, every value
escaped (``reconciler.api.page.templates``). Called by ``reconciler.api.page.snapshot``; the plan, the tmpfs and
the audit trail are ``reconciler.api.page.sections``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reconciler.api.page.markup import ago, el, size, table
from reconciler.api.page.templates import Html, join, render
from reconciler.plan.verdict import Verdict, acting, acting_on, decide, in_flight

VERDICTS = {
    "converged": "converged",
    "converging": "converging",
    "blocked": "blocked",
    "held": "held in backoff",
    "invalid": "files invalid: the last valid desired state is kept",
    "unavailable": "a source is unavailable: what it shows is unknown",
}


def verdict(status: dict[str, Any]) -> Verdict:
    """The host's verdict, as every view gives it (``reconciler.plan.verdict``): the one the status carries."""
    v = status.get("verdict")
    if isinstance(v, dict) and v.get("word") in VERDICTS:
        return Verdict(str(v["word"]), str(v.get("reason") or ""))
    return decide(status)


def header(status: dict[str, Any], health: dict[str, Any] | None, *, version: str) -> Html:
    v = verdict(status)
    word = v.word
    last = (health or {}).get("last_pass") or {}
    last_pass = f"{last.get('result', '-')} ({ago(last.get('at'))})" if last else "none yet"
    sources = join((_source(name, state, status) for name, state in sorted((status.get("sources") or {}).items())), " ")
    note = ""
    if word == "unavailable":
        note = el("p", "What an unavailable source would show is greyed out: unknown, never free.", class_="note")
    elif word == "invalid":
        problems = (status.get("error") or {}).get("problems") or []
        note = el(
            "ul",
            *(el("li", f"{p.get('path')}:{p.get('line')}: {p.get('message')}") for p in problems),
            class_="problems",
        )
    src = status.get("source")
    desired_from = Html("")
    if isinstance(src, dict):
        desired_from = join(
            (
                el("dt", "desired state"),
                el(
                    "dd",
                    f"{src.get('url')} {src.get('ref')}: commit {(src.get('commit') or 'none')[:12]} "
                    f"({src.get('state')})",
                    id="git-source",
                    data_state=str(src.get("state")),
                ),
            ),
            "",
        )
    return render(
        "header.html",
        verdict=word,
        desired_from=desired_from,
        verdict_text=VERDICTS[word],
        reason=v.reason,
        host=status.get("host", "?"),
        version=version,
        install_id=status.get("install_id") or "none yet",
        last_pass=last_pass,
        sources=sources,
        note=note,
    )


def _source(name: str, state: Any, status: dict[str, Any]) -> Html:
    """One source in the header; the GPU's under ``gpu_telemetry: none`` is not looked at at all: n/a."""
    if name == "gpu" and status.get("gpu_telemetry") == "none":
        return el("span", "gpu n/a", class_="source na", data_source=name, title="gpu_telemetry: none in host.yaml")
    return el("span", f"{name}: {state}", class_="source " + ("ok" if state == "ok" else "down"), data_source=name)


# ---------------------------------------------------------------- slots


def slot_state(slot: dict[str, Any]) -> str:
    """A slot's state in one word: free, pending (wanted, nothing on it yet), entering, serving, asleep, failed,
    blocked (wanted, and something the tool does not own holds it), foreign (not wanted, and held so), unknown (a
    source it needs is down)."""
    containers = slot.get("containers") or []
    if any(c.get("owner") != "ours" for c in containers) or (slot.get("processes") and not containers):
        return "blocked" if slot.get("desired") else "foreign"
    running = [c for c in containers if c.get("state") == "running"]
    if running:
        c = running[0]
        if not c.get("healthy"):
            return "entering"
        return "asleep" if c.get("sleeping") is True else "serving"
    if containers:
        return "failed"
    if slot.get("free") is None:
        return "unknown"
    return "pending" if slot.get("desired") else "free"


def vram(slot: dict[str, Any]) -> Html:
    total, used = slot.get("memory_total_bytes"), slot.get("memory_used_bytes")
    if not isinstance(total, int) or not isinstance(used, int) or total <= 0:
        return el("span", "no telemetry for this card", class_="unknown")
    reserve = slot.get("reserve_bytes")
    high = total - reserve if isinstance(reserve, int) else None
    meter = el("meter", min=0, max=total, value=used, high=high, optimum=0, title=f"{size(used)} used")
    words = f"{size(used)} used of {size(total)}, {size(slot.get('memory_free_bytes'))} free"
    if isinstance(reserve, int):
        words += f"; reserve {size(reserve)}"
    below = el("strong", " below reserve", class_="below-reserve") if slot.get("below_reserve") else ""
    unlisted = slot.get("unlisted_used_bytes")
    extra = el("span", f"; unlisted {size(unlisted)}", class_="unlisted") if unlisted else ""
    return join([meter, " ", words, below, extra])


def sparkline(points: list[tuple[float, int]], *, total: Any, width: int = 160, height: int = 28) -> Html:
    """Free VRAM over the last hour as a small inline SVG line (presentation attributes only: no style, no script),
    with its range in words for those who do not see it."""
    if len(points) < 2 or not isinstance(total, int) or total <= 0:
        return Html("")
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1.0)
    xy = " ".join(
        f"{(t - t0) / span * width:.1f},{height - min(max(free / total, 0.0), 1.0) * height:.1f}" for t, free in points
    )
    low, high = min(f for _, f in points), max(f for _, f in points)
    words = f"free VRAM over the last {span / 60:.0f} min: {size(low)} to {size(high)}"
    line = el("polyline", points=xy, fill="none", stroke="currentColor", stroke_width="1.5")
    svg = el(
        "svg",
        el("title", words),
        line,
        class_="spark",
        viewBox=f"0 0 {width} {height}",
        role="img",
        aria_label=words,
        width=width,
        height=height,
    )
    return join([svg, " ", el("span", words, class_="spark-words")])


def slot_card(name: str, slot: dict[str, Any], history: list[tuple[float, int]] | None = None) -> Html:
    state = slot_state(slot)
    containers = slot.get("containers") or []
    running = join(
        (
            el(
                "span",
                f"{c.get('name')} ({c.get('state')}{', asleep' if c.get('sleeping') is True else ''}"
                f"{'' if c.get('owner') == 'ours' else ', not ours: ' + str(c.get('owner'))})",
                class_="container",
            )
            for c in containers
        ),
        ", ",
    )
    procs = join(
        (
            el("span", f"pid {p.get('pid')} {p.get('container') or 'no container'} {size(p.get('used_bytes'))}")
            for p in slot.get("processes") or []
        ),
        ", ",
    )
    unknown = slot.get("unknown") or []
    return render(
        "slot.html",
        slot=name,
        state=state,
        state_text=state,
        gpu=f"index {slot.get('index')}" + (f" {slot.get('name')}" if slot.get("name") else ""),
        wanted=slot.get("desired") or "nothing (free)",
        running=running or "nothing",
        vram=join([vram(slot), sparkline(history or [], total=slot.get("memory_total_bytes"))], " "),
        processes=procs or "none",
        unknown=el("p", f"unknown while {', '.join(unknown)} is unavailable", class_="unknown") if unknown else "",
    )


# ---------------------------------------------------------------- lanes


@dataclass
class Lane:
    """One lane: a recipe on its slots, wanted by the manifest, or still running while it is not (leaving)."""

    recipe: str
    slots: tuple[str, ...]
    wanted: bool
    containers: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)  # its failed containers kept for their logs

    @property
    def key(self) -> str:
        return f"{self.recipe}@{'+'.join(self.slots)}"


def kept_failures(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The failed containers of this install kept for their logs (stopped: they hold no slot and serve nothing),
    listed apart from the lanes: an old failed enter is no lane failing now."""
    return [
        c
        for c in status.get("containers") or []
        if c.get("owner") == "ours" and c.get("preserved") and c.get("state") != "running"
    ]


def lanes_of(status: dict[str, Any]) -> list[Lane]:
    """Every lane: each wanted assignment (from the slots' ``desired``) and each container of this install but the
    failed ones kept for their logs (``kept_failures``), which a wanted lane still counts (its last enter failed)."""
    kept = {id(c) for c in kept_failures(status)}
    lanes: dict[str, Lane] = {}
    wanted: dict[str, list[str]] = {}
    for slot, s in (status.get("slots") or {}).items():
        if s.get("desired"):
            wanted.setdefault(str(s["desired"]), []).append(slot)
    for recipe, slots in wanted.items():
        lane = Lane(recipe, tuple(slots), True)
        lanes[lane.key] = lane
    for a in status.get("standby") or ():  # kept asleep beside the running topology: wanted too
        lane = Lane(str(a.get("recipe")), tuple(a.get("gpus") or ()), True)
        lanes.setdefault(lane.key, lane)
    for c in status.get("containers") or []:
        if c.get("owner") != "ours" or not c.get("recipe"):
            continue
        lane = Lane(str(c["recipe"]), tuple(c.get("slots") or ()), False)
        if id(c) in kept:
            if lane.key in lanes:
                lanes[lane.key].failed.append(c)
            continue
        lanes.setdefault(lane.key, lane).containers.append(c)
    return sorted(lanes.values(), key=lambda ln: (not ln.wanted, ln.recipe, ln.slots))


def _matches(item: dict[str, Any], lane: Lane) -> bool:
    return item.get("recipe") == lane.recipe and tuple(item.get("gpus") or ()) == lane.slots


KEPT_SERVING = "kept serving: what would replace it is blocked"

# A lane's phase while an action on it is in flight (the running loop's pass, or this page's own apply), by kind.
ACTING = {"enter": "entering", "wake": "waking", "sleep": "going-to-sleep", "leave": "leaving"}


def lane_phase(
    lane: Lane, plan: dict[str, Any], progress: dict[str, Any] | None = None, status: dict[str, Any] | None = None
) -> str:
    """A lane's phase in one word: pending, entering, waking, going-to-sleep, serving, asleep, leaving, kept
    (serving on a slot whose replacement is blocked), failed, held, blocked, stopped. What is happening to it now
    comes first: an action of this page's own apply in flight (``progress``), else the action of the plan the
    running loop's pass is taking now (``reconciler.plan.verdict.acting_on``, as the verdict and the plan's
    "in flight" reason read it): a sleeping lane being woken is waking, not asleep."""
    kind = (progress or {}).get("kind") or acting_on(status or {}, lane.recipe, lane.slots)
    if kind:
        return ACTING.get(str(kind), "leaving")
    running = [c for c in lane.containers if c.get("state") == "running"]
    if not lane.wanted:
        if any(c.get("name") in (plan.get("kept_serving") or ()) for c in running):
            return "kept"
        return "leaving" if running else "stopped"
    if any(_matches(h, lane) for h in plan.get("held") or ()):
        return "held"
    if running:
        c = running[0]
        if not c.get("healthy"):
            return "entering"
        return "asleep" if c.get("sleeping") is True else "serving"
    if any(_matches(b, lane) for b in plan.get("blockers") or ()):
        return "blocked"
    planned = any(_matches(a, lane) and a.get("kind") in ("enter", "wake") for a in plan.get("actions") or ())
    if lane.failed and not planned and not acting(status or {}):
        return "failed"  # its last enter failed, and nothing is about to try again
    return "pending"


def _progress_text(p: dict[str, Any]) -> str:
    text = str(p.get("detail") or p.get("phase") or "")
    elapsed, timeout = p.get("elapsed"), p.get("timeout")
    if isinstance(elapsed, int | float) and elapsed > 0:
        text += f" ({elapsed:.1f} s" + (f" of {timeout:.0f} s" if isinstance(timeout, int | float) else "") + ")"
    return text


def _probes(runs: dict[str, Any]) -> Html:
    if not runs:
        return Html("")
    parts = []
    for suite, run in sorted(runs.items()):
        probes = [
            el("li", f"{p.get('name')}: {'ok' if p.get('ok') else 'failed'} in {p.get('seconds')} s", class_="probe")
            for p in run.get("probes") or []
        ]
        head = f"{suite}: {run.get('passed')}/{run.get('planned')} passed {ago(run.get('started'))}"
        parts.append(el("details", el("summary", head), el("ul", *probes), data_suite=suite))
    return join(parts)


def lane_card(
    lane: Lane,
    plan: dict[str, Any],
    recipe: dict[str, Any] | None,
    suites: dict[str, Any],
    progress: dict[str, Any] | None,
    status: dict[str, Any] | None = None,
) -> Html:
    phase = lane_phase(lane, plan, progress, status)
    shown = lane.containers or (lane.failed if phase == "failed" else [])
    c = next((c for c in shown if c.get("state") == "running"), shown[0] if shown else {})
    health = "healthy" if c.get("healthy") else ("not healthy yet" if c.get("state") == "running" else "not running")
    if c.get("sleeping") is True:
        health += ", asleep"
    detail = ""
    if progress:
        detail = el("p", _progress_text(progress), class_="progress", data_progress=progress.get("phase"))
    elif phase == "kept":
        detail = el("p", KEPT_SERVING, class_="kept")
    else:
        for a in plan.get("actions") or ():
            if _matches(a, lane) and in_flight(status or {}, a):
                detail = el("p", f"in flight: the running loop's own {a.get('kind')}", class_="progress")
        for b in plan.get("blockers") or ():
            if _matches(b, lane):
                detail = el("p", f"blocked: {b.get('reason')} (held by {b.get('holder') or '?'})", class_="blocker")
        for h in plan.get("held") or ():
            if _matches(h, lane):
                detail = el("p", f"held: {h.get('reason')}", class_="held")
    info = recipe or {}
    return render(
        "lane.html",
        vllm=_vllm_text(c.get("vllm")),
        recipe=lane.recipe,
        phase=phase,
        phase_text=phase_text(lane, phase),
        slots=", ".join(lane.slots),
        model=info.get("model") or "unknown",
        image=info.get("image") or "unknown",
        container=f"{c.get('name')} {c.get('id')} ({c.get('state')})" if c else "none",
        health=health,
        detail=detail,
        probes=_probes(suites),
    )


def phase_text(lane: Lane, phase: str) -> str:
    if phase == "kept":
        return KEPT_SERVING
    phase = phase.replace("-", " ")  # going-to-sleep: the hook is one token, the words are words
    return phase if lane.wanted else f"{phase} (no longer wanted)"


def _vllm_text(v: Any) -> str:
    """The lane's own server as it answered: its vLLM release and live figures (requests, KV cache, offload)."""
    if not isinstance(v, dict):
        return "not read"
    if v.get("error") and not v.get("version"):
        return f"no answer: {v['error']}"
    g = v.get("gauges") or {}
    parts = [f"vLLM {v.get('version') or '?'}"]
    if g.get("requests_running") is not None:
        parts.append(f"{g['requests_running']:g} running, {g.get('requests_waiting') or 0:g} waiting")
    if g.get("kv_cache_usage_ratio") is not None:
        parts.append(f"KV cache {100 * g['kv_cache_usage_ratio']:.0f} % used")
    if g.get("offload_store_bytes") is not None:
        stored, loaded = size(g["offload_store_bytes"]), size(g.get("offload_load_bytes") or 0)
        parts.append(f"offload stored {stored}, loaded {loaded}")
    if v.get("offload_file"):
        parts.append(f"offload file {v['offload_file']}")
    return "; ".join(parts)


def lane_cards(status: dict[str, Any], recipes: dict[str, dict[str, Any]], progress: dict[str, dict[str, Any]]) -> Html:
    plan = status.get("plan") or {}
    suites = status.get("probe_suites") or {}
    cards = [
        lane_card(lane, plan, recipes.get(lane.recipe), suites.get(lane.recipe) or {}, progress.get(lane.key), status)
        for lane in lanes_of(status)
    ]
    return join(cards) if cards else el("p", "no lane is wanted or running", class_="none")


def kept_section(status: dict[str, Any]) -> Html:
    """The failed containers kept for their logs, apart from the lanes, with what to do about them."""
    kept = kept_failures(status)
    if not kept:
        return Html("")
    rows = (
        [
            el("span", c.get("name"), data_kept=c.get("name")),
            c.get("recipe"),
            ", ".join(c.get("slots") or ()),
            c.get("exit_code"),
        ]
        for c in kept
    )
    return join(
        [
            el("h3", "Failed containers kept for their logs"),
            el(
                "p",
                "They hold no slot and serve nothing: docker logs NAME says why each failed; `reconciler prune` "
                "removes them.",
                class_="note",
            ),
            table(("container", "recipe", "slots", "exit code"), rows, class_="kept-failures"),
        ]
    )


def slot_cards(status: dict[str, Any], history: dict[str, list[tuple[float, int]]] | None = None) -> Html:
    return join(slot_card(name, s, (history or {}).get(name)) for name, s in (status.get("slots") or {}).items())
