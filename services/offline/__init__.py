"""Offline tools: commands that combine services without running any of them.

Not a service: nothing here is deployed. A tool may import several services
(which a service never does), e.g. discovery's simulated fleets and the
publisher's renderer to print a node's slices without a cluster.
"""
