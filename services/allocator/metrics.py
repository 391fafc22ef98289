"""The claim watcher's Prometheus metrics (beside the bus's shared ones)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

WATCH_RESTARTS = Counter(
    "gpudra_allocator_watch_restarts_total",
    "Watches restarted: expired (410, relisted), ended by the server, or failed.",
    ["resource", "reason"],
)
MALFORMED_OBJECTS = Counter(
    "gpudra_allocator_malformed_objects_total",
    "API objects or watch events that did not decode and were skipped.",
    ["resource"],
)
HANDLER_FAILURES = Counter(
    "gpudra_allocator_handler_failures_total",
    "Object changes whose handling raised; the object is skipped, the watch goes on.",
    ["resource"],
)
CLAIM_EVENTS = Counter(
    "gpudra_allocator_claim_events_total", "Claim lifecycle events published.", ["event"]
)
EXPLANATIONS = Counter(
    "gpudra_allocator_explanations_total",
    "Pending claims explained, by outcome of our allocator (allocated, unschedulable, error).",
    ["status"],
)
K8S_EVENTS = Counter(
    "gpudra_allocator_kubernetes_events_total",
    "Kubernetes Events written on claims (create, update, failed).",
    ["op"],
)
TRACKED_CLAIMS = Gauge(
    "gpudra_allocator_allocated_claims", "Claims allocated for our driver, as last seen."
)
