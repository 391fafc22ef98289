"""Unit tests of the shared kernel (services/core)."""
