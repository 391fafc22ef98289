"""GPU model tables (one YAML file per model): identity facts and MIG profiles."""
