"""Unit tests of the preparer."""
