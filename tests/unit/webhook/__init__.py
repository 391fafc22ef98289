"""Unit tests of the admission webhook."""
