"""Prometheus metrics shared by every service; each service adds its own beside these."""

from __future__ import annotations

from prometheus_client import Counter, start_http_server

MALFORMED_MESSAGES = Counter(
    "gpudra_bus_malformed_messages_total",
    "Bus messages that failed schema decoding and were skipped.",
    ["source"],
)

FOREIGN_MESSAGES = Counter(
    "gpudra_bus_foreign_messages_total",
    "Messages refused because they did not come from the identity that may send them "
    "(e.g. stream messages pushed to a service subject by someone's consumer).",
    ["subject"],
)


def serve(port: int) -> None:
    """Expose /metrics on 127.0.0.1:port (0 disables)."""
    if port:
        start_http_server(port, addr="127.0.0.1")
