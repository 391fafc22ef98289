"""Unit tests of the local stack, control plane and real nodes."""
