"""The publisher's throughput settings and their defaults (no imports: the CLI reads them).

A node's slices are written together, so 64 workers keep 64 to ~600 writes in
flight: the API server and etcd spend less CPU per write with more in flight
(bench/scale.py, 1,000 nodes of one slice: 6.3 ms per write at 16 against 4.8
at 64), and the request budget (client-go's QPS and burst) caps the pace.
Replicas split the nodes into ``DEFAULT_SHARDS`` lease shards
(services.publisher.shards).
"""

DEFAULT_WORKERS = 64
DEFAULT_QPS = 500.0
DEFAULT_BURST = 1000
DEFAULT_SHARDS = 64
