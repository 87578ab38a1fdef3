"""The ``reconciler_probe_*`` families and free VRAM under load: read from the host's record of probe runs
(``reconciler.store.probe_history``) at each scrape, so a suite run by the loop's enter, the command line, the API or
MCP shows at once, whichever process ran it. Registered by ``reconciler.loop.metrics.Metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily

from reconciler.loop.metric_families import PREFIX
from reconciler.store.probe_history import last_suites


class ProbeCollector:
    """The ``reconciler_probe_*`` families and free VRAM under load, from ``reconciler.store.probe_history`` at each
    collect: per probe its last result and duration, per suite its last run, per card its lowest free figure while
    the suite ran (labelled with the probe running then) and whether that was below the reserve."""

    def __init__(self, host: Callable[[], str | None], recipes: Callable[[], set[str]]):
        self._host = host
        self._recipes = recipes

    def describe(self) -> list:
        return []  # nothing to check at registration: the families depend on what ran

    def collect(self) -> Iterable:
        p = PREFIX
        ok = GaugeMetricFamily(
            f"{p}_probe_success",
            "1 when the probe passed in the last run of its suite, 0 when it failed.",
            labels=["recipe", "suite", "probe", "kind"],
        )
        dur = GaugeMetricFamily(
            f"{p}_probe_duration_seconds",
            "How long the probe took in the last run of its suite.",
            labels=["recipe", "suite", "probe", "kind"],
        )
        suite_ok = GaugeMetricFamily(
            f"{p}_probe_suite_success",
            "1 when every probe of the suite passed in its "
            "last run (and the cards kept their reserve under enforce), 0 when not.",
            labels=["recipe", "suite"],
        )
        last = GaugeMetricFamily(
            f"{p}_probe_suite_last_run_timestamp_seconds",
            "Unix time the suite's last run started.",
            labels=["recipe", "suite"],
        )
        low = GaugeMetricFamily(
            f"{p}_gpu_memory_free_under_load_min_bytes",
            "The lowest free GPU memory of a "
            "lane's card while the suite last ran (NVML, sampled a few times a second), and the "
            "probe that was running then ('' between probes).",
            labels=["recipe", "suite", "slot", "probe"],
        )
        below = GaugeMetricFamily(
            f"{p}_gpu_memory_under_load_below_reserve",
            "1 when that lowest figure was below the card's free-VRAM reserve, 0 when not.",
            labels=["recipe", "suite", "slot"],
        )
        host = self._host()
        runs = last_suites(host, self._recipes() or None) if host else {}
        for recipe, suites in runs.items():
            for suite, run in suites.items():
                under = run.get("vram_under_load") or {}
                suite_ok.add_metric([recipe, suite], 1.0 if run.get("ok") and not under.get("failed") else 0.0)
                last.add_metric([recipe, suite], float(run.get("started") or 0))
                for pr in run.get("probes") or ():
                    labels = [recipe, suite, str(pr.get("name")), str(pr.get("kind"))]
                    ok.add_metric(labels, 1.0 if pr.get("ok") else 0.0)
                    dur.add_metric(labels, float(pr.get("seconds") or 0))
                for slot, fig in (under.get("slots") or {}).items():
                    low.add_metric([recipe, suite, slot, str(fig.get("probe") or "")], float(fig["min_free_bytes"]))
                    below.add_metric([recipe, suite, slot], 1.0 if fig.get("below_reserve") else 0.0)
        return [ok, dur, suite_ok, last, low, below]
