"""The ComputeDomain controller (``gpudra domains``).

It watches ComputeDomains and, for each, creates the workload
ResourceClaimTemplate in the domain's namespace and the IMEX daemon's
ResourceClaimTemplate and DaemonSet in the driver's namespace, as the
reference's controller does (names, labels, finalizers, deletion order, orphan
sweep). Membership and readiness do not go through the API server: each node's
daemon writes its own key in the bus's ``domains`` bucket, the controller gives
each member a stable index in its clique and writes the ComputeDomain's status
from that state, batched (docs/computedomains.md).
"""
