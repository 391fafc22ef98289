"""Integration tests (a real nats-server) of the preparer."""
