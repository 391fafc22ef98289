"""The claim watcher: informers on claims, pods, classes, slices and nodes; lifecycle events
on the bus, the ``claims`` bucket for the preparers, and why-pending Kubernetes Events."""
