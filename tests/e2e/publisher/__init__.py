"""End-to-end tests (the real control plane) of the publisher."""
