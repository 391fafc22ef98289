"""Prepare for the ``compute-domain.nvidia.com`` driver: what its claims' containers get.

The gate (domain, node label, readiness), the CDI edits and the engine that
prepares and unprepares channel and daemon claims with them, checkpointed like
the GPU driver's claims, as the reference's plugin does
(cmd/compute-domain-kubelet-plugin: device_state.go, cdi.go, nvlib.go).
"""
