"""End-to-end tests (the real control plane) of the NATS auth callout."""
