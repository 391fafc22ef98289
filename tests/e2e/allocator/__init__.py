"""End-to-end tests (the real control plane) of the allocator: allocation, CEL, the watcher."""
