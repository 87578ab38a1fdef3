"""``/healthz``'s answer (``health_answer``): its status code from what the loop knows of its last pass, its verdict
the one every view gives (``reconciler.plan.verdict``), from the listener's snapshot of the host (``with_verdict``).
Called by ``reconciler.loop.Loop.health``, which the HTTP listener asks (``Hosting.health``).
"""

from __future__ import annotations

from typing import Any

from reconciler.base.redact import redact_data
from reconciler.plan.verdict import Verdict

# What the last pass's result says, where no look at the host gives the verdict (the listener's snapshot cannot be
# made): a pass that ended acting or failing leaves work for the next.
_BY_RESULT = {"converged": "converged", "blocked": "blocked", "held": "held"}


def health_answer(
    *,
    age: float | None,
    resync_s: float,
    down_codes: dict[str, str],
    last: dict[str, Any],
    files_valid: bool | None,
    passes: int,
) -> tuple[int, dict[str, Any]]:
    """A recent pass that could read every source. A loop waiting for an engine that does not answer is alive but
    cannot act: 503, with the source and its short cause (slow, down, error) in "unavailable". Answered without a
    token, so it quotes no cause: a failed enter's cause quotes its container's log, a source's error its engine's
    words. The last pass's message is its result's word; ``status`` and ``GET /v1/status`` say the rest.

    ``age``: seconds since the last pass ended (None: none yet); ``down_codes``: each source the last pass could not
    read with its short cause; ``last``: the last pass's record; ``files_valid``: whether the files loaded at the
    last look (None: not read yet). The verdict here is the last pass's, until ``with_verdict`` gives the one of the
    host as it is now."""
    fresh = age is not None and age < max(3 * resync_s, 300)
    down = dict(down_codes)
    ok = fresh and not down
    last_pass = (
        {
            "result": last["result"],
            "message": last["result"],
            "at": last["at"],
            "unavailable": {name: down_codes.get(name, "error") for name in last.get("unavailable", {})},
        }
        if last
        else {}
    )
    # The files' state is part of the verdict, not of the status code: a loop keeping the last valid desired
    # state while an edit does not validate is alive and acting (status and validate say what is wrong).
    files = {None: "unread", True: "valid", False: "invalid"}[files_valid]
    if files_valid is False:
        verdict = Verdict("invalid", "files invalid: the last valid desired state is kept")
    elif down:
        verdict = Verdict("unavailable", f"{', '.join(sorted(down))} unavailable")
    elif last:
        verdict = Verdict(_BY_RESULT.get(str(last["result"]), "converging"), f"the last pass: {last['result']}")
    else:
        verdict = Verdict("converging", "starting: no pass has ended yet")
    return (200 if ok else 503), redact_data(
        {
            "ok": ok,
            "verdict": verdict.word,
            "reason": verdict.reason,
            "files": files,
            "passes": passes,
            "last_pass_age_s": age,
            "unavailable": down,
            "last_pass": last_pass,
        }
    )


def with_verdict(body: dict[str, Any], verdict: Verdict | None) -> dict[str, Any]:
    """``/healthz``'s answer with the verdict of the host as it is now (the listener's snapshot, which the page,
    ``/metrics``, ``GET /v1/status`` and ``status`` share); its status code stays the loop's own. The reason quotes
    no cause, as the rest of the answer does: lanes, slots and action kinds only."""
    if verdict is None:
        return body
    return {**body, "verdict": verdict.word, "reason": redact_data(verdict.reason)}
