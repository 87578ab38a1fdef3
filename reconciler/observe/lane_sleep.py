"""Whether each sleeping-mode lane sleeps, by its own answer: ``GET /is_sleeping`` on its origin (loopback only, as
the probes; never through a proxy). A lane that does not answer, or answers anything but ``{"is_sleeping": bool}``,
is left out: not known, never assumed asleep (docs/design.md, sleeping lanes rule 1; a 200 from /health proves
nothing, since vLLM answers it while asleep).

Read-only. Called by ``reconciler.observe.observe`` when some recipe has [sleep]; the lanes are asked at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from reconciler.base import direct_http
from reconciler.plan.observed import LABEL_HOST, LABEL_MANAGED, ContainerView

ASK_TIMEOUT_S = 2.0


def ask_sleeping(origin: str, timeout: float = ASK_TIMEOUT_S) -> bool | str:
    """The lane's answer to GET /is_sleeping: True or False, or a short text of why there is none."""
    import urllib.request

    req = urllib.request.Request(origin.rstrip("/") + "/is_sleeping", method="GET")  # noqa: S310 - the recipe's loopback origin (model.check_health_url)
    try:
        with direct_http.opener().open(req, timeout=timeout) as resp:
            body = resp.read(4096)
    except direct_http.errors() as exc:
        return f"GET {origin}/is_sleeping: {type(exc).__name__}: {exc}"
    try:
        value = json.loads(body).get("is_sleeping")
    except (ValueError, AttributeError):
        value = None
    if not isinstance(value, bool):
        return f"GET {origin}/is_sleeping answered no is_sleeping true or false"
    return value


def read_sleeping(
    host: str,
    containers: Sequence[ContainerView],
    origins: Mapping[str, str],
    ask: Callable[[str], bool | str] = ask_sleeping,
) -> dict[str, bool]:
    """Container id -> its answer, for each running container of this host whose recipe is in ``origins``; each
    asked through ``ask`` (``ask_sleeping``; the simulation's world answers)."""
    asked = [
        (c.id, origins[c.recipe or ""])
        for c in containers
        if c.state == "running"
        and c.recipe in origins
        and c.label(LABEL_MANAGED) == "true"
        and c.label(LABEL_HOST) == host
    ]
    if not asked:
        return {}
    if len(asked) == 1:
        answers = [ask(asked[0][1])]
    else:
        with ThreadPoolExecutor(max_workers=min(8, len(asked)), thread_name_prefix="is-sleeping") as pool:
            answers = list(pool.map(ask, [o for _, o in asked]))
    return {cid: a for (cid, _), a in zip(asked, answers, strict=True) if isinstance(a, bool)}
