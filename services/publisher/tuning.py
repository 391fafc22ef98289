"""The publisher's throughput settings and their defaults (no imports: the CLI reads them).

A node's slices are written together, so 16 workers keep up to ~150 writes in
flight; the request budget (client-go's QPS and burst), not the workers, sets
the pace of a first publish. Replicas split the nodes into ``DEFAULT_SHARDS``
lease shards (services.publisher.shards).
"""

DEFAULT_WORKERS = 16
DEFAULT_QPS = 500.0
DEFAULT_BURST = 1000
DEFAULT_SHARDS = 64
