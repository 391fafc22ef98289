"""Unit tests of the publisher."""
