"""Structured allocation (CEL), claim watcher, explanations."""
