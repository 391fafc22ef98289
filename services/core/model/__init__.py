"""What gpudra is about: the NVIDIA device model, the driver's feature gates, shares,
opaque configs, ComputeDomains and the bus's payload schemas. Pure data and rules,
no I/O; it imports the kube layer and the kit."""
