"""The publisher's throughput settings and their defaults (no imports: the CLI reads them).

A node's slices are written together, so 64 workers keep 64 to ~600 writes in
flight: the API server and etcd spend less CPU per write with more in flight
(bench/scale.py, 1,000 nodes of one slice: 6.3 ms per write at 16 against 4.8
at 64), and the request budget (client-go's QPS and burst) caps the pace.
Replicas split the nodes into ``DEFAULT_SHARDS`` lease shards
(services.publisher.shards).

The collector's first generation waits for ``GC_GEN0`` new objects instead of 700:
a write's render, body and answer are thousands of short-lived objects, and at
Python's default a first publish spent 0.36 ms of the publisher's 1.7 ms per write
in 480 collections per 1,000 writes (1,000 nodes of one slice); at 20,000, 0.01 ms.
The publisher answers no one while it writes, so fewer, longer pauses cost nothing.
"""

DEFAULT_WORKERS = 64
DEFAULT_QPS = 500.0
DEFAULT_BURST = 1000
DEFAULT_SHARDS = 64
GC_GEN0 = 20_000
