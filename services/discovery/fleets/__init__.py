"""Simulated fleets (one YAML file per fleet): the GPUs of one simulated node."""
