"""Unit tests of discovery."""
