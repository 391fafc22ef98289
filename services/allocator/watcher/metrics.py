"""The claim watcher's Prometheus metrics (beside the bus's shared ones)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
EXPLANATIONS_REUSED = Counter(
    "gpudra_allocator_explanations_reused_total",
    "Pending claims told the outcome of a claim like them (same namespace and spec, same "
    "devices, at most a minute old) instead of running the allocator again.",
)
EXPLAIN_CPU = Counter(
    "gpudra_allocator_explain_cpu_seconds_total",
    "CPU seconds spent explaining pending claims: taking a snapshot of the caches "
    "(snapshot) and running our allocator over it (allocate).",
    ["phase"],
)
EXPLANATIONS_DUE = Gauge(
    "gpudra_allocator_explanations_due",
    "Pending claims whose explanation is due in the current check and not yet written "
    "(set at the check's start, down by one per explanation; 0 once it is through).",
)
CLAIMS_BEFORE_AUDIT_WINDOW = Gauge(
    "gpudra_allocator_claims_before_audit_window",
    "Claims allocated now that were created before the oldest event CLAIMS still holds, "
    "once it has dropped any: their first events may be gone (gpudra audit --verify).",
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
CLAIM_EVENT_SECONDS = Histogram(
    "gpudra_allocator_claim_event_seconds",
    "Time to number and store one claim event, by event (exemplars: its trace id); "
    "includes waiting out a bus that does not answer.",
    ["event"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
