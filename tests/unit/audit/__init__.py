"""Unit tests of gpudra audit."""
