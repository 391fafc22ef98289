"""Unit tests of the NATS auth callout."""
