"""The ComputeDomain controller's Prometheus metrics (beside the bus's shared ones)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECONCILES = Counter(
    "gpudra_domains_reconciles_total",
    "Passes over one ComputeDomain's objects, by result (ok, retry, conflict, error).",
    ["result"],
)
STATUS_WRITES = Counter(
    "gpudra_domains_status_writes_total", "ComputeDomain status writes (one per changed status)."
)
MEMBERS = Gauge("gpudra_domains_members", "Member keys seen in the domains bucket.")
BINDING_WRITES = Counter(
    "gpudra_domains_binding_writes_total",
    "Channel claims' binding conditions written, by what they say (waiting, ready, failed).",
    ["state"],
)
SWEPT = Counter("gpudra_domains_swept_total", "Deleted domains whose leftovers were swept.")
