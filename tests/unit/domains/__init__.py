"""Unit tests of ComputeDomains: the controller and the node side."""
