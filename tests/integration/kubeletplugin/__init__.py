"""Integration tests (a real nats-server) of the kubelet plugin front."""
