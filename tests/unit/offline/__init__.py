"""Unit tests of the offline tools."""
