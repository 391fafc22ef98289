"""Integration tests (a real nats-server) of discovery."""
