"""Unit tests of the Helm chart."""
