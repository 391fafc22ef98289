"""Benchmarks that print figures (p50/p99, throughput, peak RSS); never timed assertions."""
