"""Unit tests of the kubelet plugin front."""
