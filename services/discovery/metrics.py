"""Prometheus metrics of the discovery service."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SCANS = Counter("gpudra_discovery_scans_total", "NVML scans of the node.", ["outcome"])
SCAN_SECONDS = Histogram(
    "gpudra_discovery_scan_seconds",
    "Time to scan every GPU of the node.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
INVENTORY_UPDATES = Counter(
    "gpudra_discovery_inventory_updates_total", "Inventories written because something changed."
)
HEALTH_EVENTS = Counter(
    "gpudra_discovery_health_events_total", "Health events published.", ["kind"]
)
SIM_REJECTED = Counter(
    "gpudra_discovery_sim_states_rejected_total",
    "Simulated NVML states that decoded but could not be used.",
)
SIM_CONFLICTS = Counter(
    "gpudra_discovery_sim_write_conflicts_total",
    "Simulated NVML changes retried because another writer changed the state first.",
)
INVENTORY_REPAIRS = Counter(
    "gpudra_discovery_inventory_repairs_total",
    "Times this node's inventory key was found changed by someone else and rewritten.",
)
