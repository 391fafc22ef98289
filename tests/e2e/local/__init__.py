"""End-to-end tests (the real control plane) of the local stack, control plane and real nodes."""
