"""Integration tests (a real nats-server) of ComputeDomains: the controller and the node side."""
