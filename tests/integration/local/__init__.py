"""Integration tests (a real nats-server) of the local stack, control plane and real nodes."""
