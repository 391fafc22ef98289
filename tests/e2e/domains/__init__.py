"""End-to-end tests (the real control plane) of ComputeDomains: the controller and the node side."""
