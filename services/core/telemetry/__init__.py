"""Logs, metrics and traces (one trace per claim life, exported over OTLP). It imports
the model (a span carries the claim) and the layers below."""
