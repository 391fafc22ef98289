"""Unit tests of the allocator: structured allocation, CEL, the claim watcher."""
