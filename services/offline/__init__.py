"""Offline tools: commands that combine services without running any of them.

Not a service: nothing here is deployed. A tool may import several services
(which a service never does): ``slices`` prints a simulated node's slices with
discovery's fleets and the publisher's renderer (``slicecheck`` checks them
against the API's limits); ``allocate`` runs the allocator's structured
allocation over objects read from files (``inputs``).
"""
