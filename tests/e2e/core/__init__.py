"""End-to-end tests (the real control plane) of the shared kernel (services/core)."""
