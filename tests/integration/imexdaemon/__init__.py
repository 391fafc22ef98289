"""Integration tests (a real nats-server) of the IMEX daemon."""
