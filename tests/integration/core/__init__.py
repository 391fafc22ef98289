"""Integration tests (a real nats-server) of the shared kernel (services/core)."""
