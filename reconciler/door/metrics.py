"""The front door's own metrics, on its own /metrics (a registry of its own: the loop's are the loop's).

``reconciler_door_requests_total{model,code}``, ``reconciler_door_queue_depth{model}``,
``reconciler_door_held_seconds``, ``reconciler_door_demand_switches_total{from,to}``,
``reconciler_door_upstream_first_byte_seconds``, and ``reconciler_door_oldest_held_seconds`` (what the alert
``ReconcilerDoorHolding`` reads). Names are a promise (docs/design.md, metrics). Called by ``reconciler.door.app``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
_BYTE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class DoorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "reconciler_door_requests_total",
            "Requests answered by the front door, by model and status code.",
            ["model", "code"],
            registry=r,
        )
        self.depth = Gauge(
            "reconciler_door_queue_depth", "Requests held now at the front door for a model.", ["model"], registry=r
        )
        self.held_seconds = Histogram(
            "reconciler_door_held_seconds",
            "How long requests were held before their lane served.",
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.switches = Counter(
            "reconciler_door_demand_switches_total",
            "Switches the front door asked for on demand.",
            ["from", "to"],
            registry=r,
        )
        self.first_byte_seconds = Histogram(
            "reconciler_door_upstream_first_byte_seconds",
            "Seconds from sending a request to its lane to the lane's first byte.",
            buckets=_BYTE_BUCKETS,
            registry=r,
        )
        self.oldest = Gauge(
            "reconciler_door_oldest_held_seconds", "Seconds the longest-held request has waited so far.", registry=r
        )
        self.hold_s = Gauge("reconciler_door_hold_seconds", "The door's door.hold_s.", registry=r)
        self.queued_models: set[str] = set()

    def request(self, model: str, code: int) -> None:
        self.requests.labels(model, str(code)).inc()

    def queue_depth(self, model: str, depth: int) -> None:
        self.queued_models.add(model)
        self.depth.labels(model).set(depth)

    def held(self, seconds: float) -> None:
        self.held_seconds.observe(seconds)

    def first_byte(self, seconds: float) -> None:
        self.first_byte_seconds.observe(seconds)

    def switched(self, before: str, after: str) -> None:
        self.switches.labels(before, after).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
