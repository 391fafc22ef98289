"""Prepare for the ``compute-domain.nvidia.com`` driver: what its claims' containers get.

Not yet wired to a socket: the node driver (registration, ResourceSlices, the
prepare path, checkpointing) is the next step (docs/computedomains.md). What is
here is what a prepared channel or daemon claim injects, as the reference does
(cmd/compute-domain-kubelet-plugin: device_state.go, cdi.go, nvlib.go).
"""
