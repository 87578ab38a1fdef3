"""The drain before a leave: wait, at most ``drain.timeout_s``, until the lane runs and queues no request.

Read from vLLM's gauges on its /metrics (``reconciler.apply.vllm_metrics.read_gauges``); a lane that is not healthy is
not drained. Its figures go into the leave's outcome as ``drain``. Used by ``reconciler.apply.leave``.
"""

from __future__ import annotations

import time
from typing import Any

from reconciler.apply.context import ActionContext
from reconciler.apply.errors import Cancelled
from reconciler.apply.http_check import _http_ok
from reconciler.model import Recipe
from reconciler.plan.actions import Action
from reconciler.plan.observed import Observed


class DrainStep(ActionContext):
    """A lane's drain before its leave stops it."""

    def _drain(self, action: Action, c: Any, recipe: Recipe | None, observed: Observed) -> str:
        """Before a lane leaves: wait until it runs and queues no request (vLLM's ``vllm:num_requests_running`` and
        ``vllm:num_requests_waiting`` on its /metrics), at most ``drain.timeout_s``; then it is stopped anyway. A lane
        that is not running, never passed its health check or does not answer it now is failing: not drained.
        Returns the note for the outcome's detail; the figures go into the outcome as ``drain``."""
        # the start-up budget: a converged `reconciler apply` drains nothing (docs/performance.md, its commands table)
        from reconciler.apply.vllm_metrics import read_gauges

        def note(record: dict[str, Any], text: str) -> str:
            self._note("drain", {**record, "note": text})
            return text

        skipped = {"drained": False, "timed_out": False, "seconds": 0.0}
        if recipe is None:
            return note(skipped, "not drained: its recipe is gone, so its metrics URL is unknown")
        if not recipe.drain.enabled:
            return note(skipped, "not drained: drain.enabled = false in its recipe")
        url = recipe.drain_metrics_url()
        if not c.active or c.id not in observed.ownership.healthy:
            return note(skipped, "not drained: it is not a healthy lane")
        if url is None:
            return note(skipped, "not drained: its recipe has no health.url or drain.metrics_url")
        if recipe.health.url and not _http_ok(recipe.health.url):
            return note(skipped, f"not drained: its health URL {recipe.health.url} does not answer (a failing lane)")
        gauges = read_gauges(url)
        if isinstance(gauges, str):
            return note(skipped, f"not drained: {gauges}")
        timeout = recipe.drain.timeout_s
        t0 = time.monotonic()
        first = int(gauges[0] + gauges[1])
        while True:
            running, waiting = gauges
            elapsed = time.monotonic() - t0
            record = {
                "drained": False,
                "timed_out": False,
                "seconds": round(elapsed, 3),
                "requests_at_start": first,
                "running": int(running),
                "waiting": int(waiting),
                "timeout_s": timeout,
                "url": url,
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
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while draining {c.name}; it still runs")
            self.progress.phase(
                action, f"draining: {int(running)} running, {int(waiting)} waiting", elapsed=elapsed, timeout=timeout
            )
            time.sleep(min(self.poll_s, max(0.01, timeout - elapsed)))
            gauges = read_gauges(url)
            if isinstance(gauges, str):
                record["seconds"] = round(time.monotonic() - t0, 3)
                return note(record, f"drain ended: {gauges}")
