"""The page's other parts: the plan (pending actions with their reasons, blockers with holder, cause and fix,
held lanes, fallbacks), the offload tmpfs (free of total, bytes by state, each file with its owners), the audit
trail's last records, the action forms (each with the session's CSRF token) and the review steps (the plan an
apply approves, by its id; the orphans a reclaim would remove, before it is confirmed).

Pure: plain values in (the service's answers, redacted by the caller), markup out, every value escaped. Called by
``reconciler.api.page.snapshot`` and ``reconciler.api.page.handlers``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import reconciler.api.page.paths as paths
from reconciler.api.page.markup import el, size, table
from reconciler.api.page.templates import Html, join
from reconciler.base.requests import DEFAULT_SUITE, PROBE_SUITES
from reconciler.plan.causes import advice_for
from reconciler.service.words import audit_what

AUDIT_SHOWN = 20


def plan_section(plan: dict[str, Any], aliases: Sequence[dict[str, Any]] = ()) -> Html:
    actions = plan.get("actions") or []
    parts: list[Any] = [
        el("h3", "Pending actions"),
        table(
            ("kind", "recipe", "slots", "reason"),
            ([a.get("kind"), a.get("recipe") or "", ", ".join(a.get("gpus") or ()), a.get("reason")] for a in actions),
            class_="actions",
        ),
    ]
    blockers = plan.get("blockers") or []
    if blockers:
        parts += [
            el("h3", "Blocked"),
            table(
                ("recipe", "slots", "holder", "why", "what to do"),
                (
                    [
                        b.get("recipe"),
                        ", ".join(b.get("gpus") or ()),
                        b.get("holder"),
                        b.get("reason"),
                        advice_for(str(b.get("cause") or "")),
                    ]
                    for b in blockers
                ),
                class_="blockers",
            ),
        ]
    held = plan.get("held") or []
    if held:
        parts += [
            el("h3", "Held in backoff"),
            table(
                ("recipe", "slots", "why"),
                ([h.get("recipe"), ", ".join(h.get("gpus") or ()), h.get("reason")] for h in held),
            ),
        ]
    fallbacks = plan.get("fallbacks") or []
    if fallbacks:
        parts += [el("h3", "Fallbacks"), el("ul", *(el("li", f.get("text")) for f in fallbacks))]
    if aliases:
        parts += [
            el("h3", "Aliases"),
            table(
                ("alias", "recipe", "verdict of its evidence", "failed gates"),
                (
                    [a.get("alias"), a.get("recipe"), a.get("verdict"), "; ".join(a.get("failures") or ())]
                    for a in aliases
                ),
                class_="aliases",
            ),
        ]
    return join(parts)


def _owners(f: dict[str, Any]) -> str:
    owners = f.get("owners") or []
    if not owners:
        return "none"
    return ", ".join(f"pid {o.get('pid')} ({o.get('container') or 'no container'}, {o.get('via')})" for o in owners)


def shm_section(summary: dict[str, Any], files: Sequence[dict[str, Any]]) -> Html:
    """``summary``: status's ``shm``; ``files``: ``shm status``'s files with their owners."""
    tmpfs = summary.get("tmpfs") or {}
    total, free = tmpfs.get("size_bytes"), tmpfs.get("free_bytes")
    meter = ""
    if isinstance(total, int) and isinstance(free, int) and total > 0:
        meter = el("meter", min=0, max=total, value=total - free, title=f"{size(total - free)} used")
    by_state = {k: v for k, v in (summary.get("files") or {}).items() if isinstance(v, dict)}
    words = [
        f"{size(free)} free of {size(total)} in {summary.get('dir')}",
        *(
            f"{state}: {by_state.get(state, {}).get('count', 0)} files, {size(by_state.get(state, {}).get('bytes'))}"
            for state in ("owned", "orphan", "blocked")
        ),
        f"deleted but still mapped: {size(summary.get('deleted_mapped_bytes'))}",
    ]
    rows = (
        [
            el("span", f.get("path"), data_file=f.get("path")),
            el("span", f.get("state"), class_=f"file-{f.get('state')}"),
            size(f.get("allocated_bytes")),
            _owners(f),
        ]
        for f in files
    )
    return join(
        [
            el("p", meter, " ", "; ".join(words), class_="tmpfs"),
            table(("file", "state", "allocated", "owners (pid, container, how)"), rows, class_="files"),
        ]
    )


def door_section(door: Any) -> Html:
    """status's ``door``: each model name and alias with its lane's state, held requests and last request; nothing
    without a live door."""
    if not isinstance(door, dict):
        return Html("")
    models = door.get("models") or {}
    rows = (
        [
            name,
            m.get("recipe"),
            el("span", m.get("state"), class_=f"door-{m.get('state')}"),
            f"{m.get('queue', 0)} (oldest {m.get('held_s', 0):.1f} s)" if m.get("queue") else "0",
            _when(m.get("last_request")) or "never",
        ]
        for name, m in sorted(models.items())
        if isinstance(m, dict)
    )
    body = table(("model", "recipe", "state", "held now", "last request"), rows, class_="door")
    return el("section", el("h2", "Front door"), body, id="door", aria_label="front door")


def _when(t: Any) -> str:
    if not isinstance(t, int | float) or isinstance(t, bool):
        return str(t or "")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t)))


def audit_section(records: Sequence[dict[str, Any]]) -> Html:
    shown = list(records)[-AUDIT_SHOWN:][::-1]
    return table(
        ("time", "front", "who", "action", "outcome", "detail"),
        (
            [
                _when(r.get("time")),
                r.get("front"),
                r.get("who"),
                r.get("action"),
                el("span", r.get("outcome"), class_=f"outcome-{r.get('outcome')}"),
                audit_what(r) or r.get("plan") or "",
            ]
            for r in shown
        ),
        class_="audit",
    )


# ---------------------------------------------------------------- forms


def csrf_input(csrf: str) -> Html:
    return el("input", type="hidden", name="csrf", value=csrf)


def form(action: str, csrf: str, *content: Any, **attrs: Any) -> Html:
    return el("form", csrf_input(csrf), *content, method="post", action=action, **attrs)


def _select(name: str, options: Sequence[str], selected: str | None = None, **attrs: Any) -> Html:
    return el("select", *(el("option", o, value=o, selected=o == selected) for o in options), name=name, **attrs)


READ_ONLY = "This session was opened with the read token: it shows the host and runs probes, and changes nothing."


def _write_forms(csrf: str, *, topologies: Sequence[str], topology: str | None) -> list[Html | str]:
    """The forms that change something: the plan to apply, the switch, the reclaim."""
    parts: list[Html | str] = [
        form(
            paths.PLAN,
            csrf,
            el("button", "Review the plan to apply", type="submit", id="review-plan"),
            " the plan is saved with an id; applying it is refused if the host changed meanwhile",
            id="plan-form",
        )
    ]
    if topologies:
        parts.append(
            form(
                paths.SWITCH,
                csrf,
                el("label", "Topology ", for_="topology"),
                _select("topology", topologies, topology, id="topology"),
                " ",
                el("button", "Switch", type="submit", id="switch"),
                id="switch-form",
            )
        )
    else:
        parts.append(el("p", "The manifest names no topologies to switch between.", class_="none"))
    parts.append(
        form(
            paths.RECLAIM,
            csrf,
            el("button", "Reclaim orphan offload files", type="submit", id="reclaim"),
            " a dry run first: nothing is removed before you confirm",
            id="reclaim-form",
        )
    )
    return parts


def actions_section(
    csrf: str, *, topologies: Sequence[str], topology: str | None, recipes: Sequence[str], read_only: bool = False
) -> Html:
    """The forms of the page's actions; ``read_only`` (a session opened with the read token): the probe's alone."""
    parts: list[Html | str] = (
        [el("p", READ_ONLY, id="read-only", class_="none")]
        if read_only
        else _write_forms(csrf, topologies=topologies, topology=topology)
    )
    if recipes:
        parts.append(
            form(
                paths.PROBE,
                csrf,
                el("label", "Probe ", for_="probe-recipe"),
                _select("recipe", recipes, id="probe-recipe"),
                " ",
                _select("suite", PROBE_SUITES, DEFAULT_SUITE, id="probe-suite"),
                " ",
                el("button", "Run the suite", type="submit", id="probe"),
                id="probe-form",
            )
        )
    return join(parts)


def plan_review(plan: dict[str, Any], csrf: str) -> Html:
    """The plan saved for an apply, with its id and the form that approves exactly it."""
    plan_id = str(plan.get("plan_id") or "")
    parts: list[Any] = [el("p", "Plan ", el("code", plan_id, id="plan-id"), " made now:"), plan_section(plan)]
    if plan.get("changes"):
        parts.append(
            form(
                paths.APPLY,
                csrf,
                el("input", type="hidden", name="plan_id", value=plan_id),
                el("button", f"Apply plan {plan_id[:8]}", type="submit", id="apply"),
                " refused as stale if anything changed since",
                id="apply-form",
            )
        )
    else:
        parts.append(el("p", "Nothing to do: the host matches its manifests.", id="nothing-to-do"))
    return join(parts)


def reclaim_review(dry: dict[str, Any], csrf: str) -> Html:
    """A reclaim's dry run: what it would remove, and the form that confirms exactly those paths."""
    would = dry.get("would_reclaim") or []
    kept = dry.get("kept") or []
    parts: list[Any] = [
        el("h2", "Would remove"),
        table(
            ("file", "allocated"),
            ([el("span", f.get("path"), data_file=f.get("path")), size(f.get("allocated_bytes"))] for f in would),
            class_="would",
        ),
        el("h2", "Kept"),
        table(("file", "why"), ([k.get("path"), k.get("reason")] for k in kept), class_="kept"),
    ]
    if would:
        hidden = [el("input", type="hidden", name="path", value=f.get("path")) for f in would]
        parts.append(
            form(
                paths.RECLAIM,
                csrf,
                el("input", type="hidden", name="confirm", value="yes"),
                *hidden,
                el("button", f"Confirm: remove {len(would)} file(s)", type="submit", id="confirm-reclaim"),
                id="confirm-form",
            )
        )
    else:
        parts.append(el("p", "No orphan to remove.", id="no-orphans"))
    return join(parts)


def flash(message: dict[str, Any] | None) -> Html:
    if not message:
        return Html("")
    return el(
        "p",
        message.get("text"),
        id="flash",
        class_=f"flash {message.get('kind', 'info')}",
        data_outcome=message.get("outcome"),
    )
