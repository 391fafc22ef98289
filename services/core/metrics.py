"""Prometheus metrics shared by every service; each service adds its own beside these."""

from __future__ import annotations

from prometheus_client import Counter, start_http_server

MALFORMED_MESSAGES = Counter(
    "gpudra_bus_malformed_messages_total",
    "Bus messages that failed schema decoding and were skipped.",
    ["source"],
)


def serve(port: int) -> None:
    """Expose /metrics on 127.0.0.1:port (0 disables)."""
    if port:
        start_http_server(port, addr="127.0.0.1")
