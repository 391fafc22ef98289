"""Integration tests (a real nats-server) of the admission webhook."""
