"""The drain before a leave or a sleep: wait, at most ``drain.timeout_s``, until the lane runs and queues no request.

Where the lane's server offers vLLM's ``POST /pause`` it drains through it, with ``wait_for_inflight_requests=true``
(admit nothing new, answer once the requests in flight finished; never the mode that aborts them): no request can slip
in between the drain and the stop or the sleep. Elsewhere (a 404: an older vLLM) vLLM's gauges on its /metrics are
polled (``reconciler.apply.vllm_metrics.read_gauges``). A lane that is not healthy is not drained. Its figures go into
the outcome as ``drain`` (``via``: pause or gauges). Before either, the requests the host's front door has in flight to
the lane are waited for (``reconciler door`` publishes them, ``HostIO.lanes.front`` reads them): the door holds new
ones for a lane whose topology no longer runs, and the drain waits until it has looked since the drain began. ``drain`` takes the action's context (``reconciler.apply.context``); used by ``reconciler.apply.leave`` and ``.sleep``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from reconciler.apply.context import ActionContext
from reconciler.apply.errors import Cancelled
from reconciler.base import direct_http
from reconciler.model import Recipe
from reconciler.plan.actions import Action
from reconciler.plan.observed import Observed


def drain(ctx: ActionContext, action: Action, c: Any, recipe: Recipe | None, observed: Observed) -> str:
    """Before a lane leaves: wait until it runs and queues no request (vLLM's ``vllm:num_requests_running`` and
    ``vllm:num_requests_waiting`` on its /metrics), at most ``drain.timeout_s``; then it is stopped anyway. A lane
    that is not running, never passed its health check or does not answer it now is failing: not drained.
    Returns the note for the outcome's detail; the figures go into the outcome as ``drain``."""

    def note(record: dict[str, Any], text: str) -> str:
        ctx.note("drain", {**record, "note": text})
        return text

    skipped = {"drained": False, "timed_out": False, "seconds": 0.0}
    why = _not_drained(ctx, c, recipe, observed)
    url = recipe.drain_metrics_url() if recipe is not None else None
    if why is not None or recipe is None or url is None:
        return note(skipped, why or "not drained")
    timeout = recipe.drain.timeout_s
    t0 = ctx.io.clock.monotonic()
    door = _drain_door(ctx, action, timeout)
    gauges = ctx.io.lanes.gauges(url)
    if isinstance(gauges, str):
        return note({**skipped, **door}, f"not drained: {gauges}")
    first = int(gauges[0] + gauges[1])
    paused = _drain_by_pause(ctx, action, recipe, first, max(0.5, timeout - (ctx.io.clock.monotonic() - t0)))
    if paused is not None:
        return note({**door, **paused[0]}, paused[1])
    while True:
        running, waiting = gauges
        elapsed = ctx.io.clock.monotonic() - t0
        record = {
            **door,
            "drained": False,
            "timed_out": False,
            "seconds": round(elapsed, 3),
            "requests_at_start": first,
            "running": int(running),
            "waiting": int(waiting),
            "timeout_s": timeout,
            "url": url,
            "via": "gauges",
        }
        if running + waiting <= 0:
            record["drained"] = True
            if not first:
                return note(record, "drained: no request in flight")
            return note(record, f"drained {first} request(s) in {elapsed:.1f} s")
        if elapsed >= timeout:
            record["timed_out"] = True
            return note(
                record,
                f"drain timed out after {timeout:g} s with {int(running)} running and "
                f"{int(waiting)} waiting: stopped anyway",
            )
        if ctx.cancel.is_set():
            raise Cancelled(f"stop requested while draining {c.name}; it still runs")
        ctx.progress.phase(
            action, f"draining: {int(running)} running, {int(waiting)} waiting", elapsed=elapsed, timeout=timeout
        )
        ctx.io.clock.sleep(min(ctx.poll_s, max(0.01, timeout - elapsed)))
        gauges = ctx.io.lanes.gauges(url)
        if isinstance(gauges, str):
            record["seconds"] = round(ctx.io.clock.monotonic() - t0, 3)
            return note(record, f"drain ended: {gauges}")


def _not_drained(ctx: ActionContext, c: Any, recipe: Recipe | None, observed: Observed) -> str | None:
    """Why a lane is not drained before it leaves or sleeps (its recipe says so, or it is failing), or None."""
    if recipe is None:
        return "not drained: its recipe is gone, so its metrics URL is unknown"
    if not recipe.drain.enabled:
        return "not drained: drain.enabled = false in its recipe"
    if not c.active or c.id not in observed.ownership.healthy:
        return "not drained: it is not a healthy lane"
    if recipe.drain_metrics_url() is None:
        return "not drained: its recipe has no health.url or drain.metrics_url"
    if recipe.health.url and not ctx.io.lanes.health_ok(recipe.health.url):
        return f"not drained: its health URL {recipe.health.url} does not answer (a failing lane)"
    return None


@contextlib.contextmanager
def taking_down(ctx: ActionContext, action: Action) -> Iterator[None]:
    """While the lane of ``action`` is drained and then stopped or put to sleep: published as being taken down, so the
    front door holds its new requests from its next look on (its view calls it ``leaving``), whoever takes it down
    and whatever its topology; the mark goes once the action ends, done or not."""
    undo = ctx.io.lanes.taking_down(ctx.desired.host.name, action.recipe or "", "+".join(action.gpus))
    try:
        yield
    finally:
        undo()


def _drain_door(ctx: ActionContext, action: Action, timeout: float) -> dict[str, Any]:
    """The front door's requests to this lane (``reconciler door``, when one runs): wait, within the drain's time,
    until the door has looked at the host since this drain began (so it saw the switch and holds new requests
    for the lane) and has none in flight to it. The figures for the outcome's ``drain`` (``door_*``)."""
    host, name = ctx.desired.host.name, action.recipe  # the door counts its requests by recipe
    t0 = ctx.io.clock.monotonic()  # the door publishes its looks on this clock too (never stepped)
    first: int | None = None
    while True:
        seen = ctx.io.lanes.front(host, name) if name else None
        elapsed = ctx.io.clock.monotonic() - t0
        if seen is None:
            return {} if first is None else {"door_requests_at_start": first, "door_seconds": round(elapsed, 3)}
        looked, in_flight, _admitting = seen
        first = in_flight if first is None else first
        # A look begun after the drain (strictly: one begun at the same clock reading may have read the manifest
        # before the switch that brought this drain, and would hold nothing for the lane).
        if looked > t0 and in_flight <= 0:
            return {"door_requests_at_start": first, "door_seconds": round(elapsed, 3)}
        if elapsed >= timeout:
            return {"door_requests_at_start": first, "door_seconds": round(elapsed, 3), "door_timed_out": True}
        if ctx.cancel.is_set():
            raise Cancelled(f"stop requested while draining the front door's requests to {name}")
        ctx.progress.phase(
            action, f"draining: {in_flight} request(s) of the front door", elapsed=elapsed, timeout=timeout
        )
        ctx.io.clock.sleep(min(0.05, max(0.01, timeout - elapsed)))


def _drain_by_pause(
    ctx: ActionContext, action: Action, recipe: Recipe, first: int, timeout: float
) -> tuple[dict[str, Any], str] | None:
    """Drain through the lane's ``POST /pause?wait_for_inflight_requests=true``: (record, note), or None where
    the server does not offer it (then the gauges are polled)."""
    origin = recipe.api_origin()
    if origin is None:
        return None
    ctx.progress.phase(action, f"draining: POST /pause, {first} request(s) in flight", timeout=timeout)
    t0 = ctx.io.clock.monotonic()
    try:
        answer = ctx.io.lanes.request(
            f"{origin}/pause?wait_for_inflight_requests=true&clear_cache=false", {}, max(timeout, 0.5)
        )
        status = answer.status
    except direct_http.errors():
        status = 0  # no answer within the drain's time: the requests are still in flight
    seconds = round(ctx.io.clock.monotonic() - t0, 3)
    if status in (404, 405):
        return None
    record = {
        "drained": status == 200,
        "timed_out": status != 200,
        "seconds": seconds,
        "requests_at_start": first,
        "timeout_s": timeout,
        "via": "pause",
    }
    if status == 200:
        return record, f"drained {first} request(s) through POST /pause in {seconds:.1f} s" if first else (
            "drained through POST /pause: no request in flight"
        )
    how = f"answered {status}" if status else f"gave no answer within {timeout:g} s"
    return record, f"drain timed out: POST /pause {how} with requests in flight: stopped anyway"
