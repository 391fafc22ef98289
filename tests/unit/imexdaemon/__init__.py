"""Unit tests of the IMEX daemon."""
