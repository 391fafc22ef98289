"""The claim watcher's Prometheus metrics (beside the bus's shared ones)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

MALFORMED_OBJECTS = Counter(
    "gpudra_allocator_malformed_bucket_entries_total",
    "Entries of the claims bucket that did not decode and were skipped.",
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
BUS_RETRIES = Counter(
    "gpudra_allocator_bus_retries_total",
    "Bus writes tried again because the bus did not answer (server restart, leader election).",
    ["write"],
)
