"""The publisher's Prometheus metrics (beside the bus's shared ones)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SLICE_WRITES = Counter(
    "gpudra_publisher_slice_writes_total", "ResourceSlice writes to the API server.", ["op"]
)
API_RETRIES = Counter(
    "gpudra_publisher_api_retries_total",
    "API calls retried after a conflict, an expired watch or a server error.",
    ["reason"],
)
INVALID_INVENTORIES = Counter(
    "gpudra_publisher_invalid_inventories_total",
    "Inventories that decoded but could not be published (skipped, old slices kept).",
    ["reason"],
)
SYNC_FAILURES = Counter(
    "gpudra_publisher_sync_failures_total", "Node syncs that failed after all retries.", ["reason"]
)
DROPPED_FIELDS = Counter(
    "gpudra_publisher_dropped_fields_total",
    "Writes after which the API server had dropped slice fields (a feature gate is off).",
    ["field"],
)
LIST_ATTRIBUTES_REFUSED = Gauge(
    "gpudra_publisher_list_attributes_refused",
    "1 while the API server cannot store list-type attributes (DRAListTypeAttributes is on "
    "here, off there or the server is older than 1.36) and numaNode is published as an int.",
)
SYNC_SECONDS = Histogram(
    "gpudra_publisher_sync_seconds",
    "Time from a node being marked dirty to its slices matching.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PUBLISHED_NODES = Gauge("gpudra_publisher_published_nodes", "Nodes whose slices are published.")


def record_writes(created: int, updated: int, deleted: int) -> None:
    for op, count in (("create", created), ("update", updated), ("delete", deleted)):
        if count:
            SLICE_WRITES.labels(op=op).inc(count)
