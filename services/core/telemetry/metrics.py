"""Prometheus metrics: the kernel's own, and serving one process's metrics on its own port.

Every module registers its metrics in prometheus_client's default registry
when imported, and a process imports shared code whose metrics it may never
use. :func:`serve` therefore exposes, per process, only the metric families
of its service (``gpudra_<service>_``), those of the shared kernel it runs
on (bus, Kubernetes client, task supervisor) and the process and Python
runtime metrics, on the address and port given to that process. Scrapes that
ask for OpenMetrics (Prometheus does) get it, and with it the exemplars that
carry the trace id of a claim operation's latency (:func:`trace_exemplar`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

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

#: Families every process may expose beside its service's own.
KERNEL_PREFIXES = ("gpudra_bus_", "gpudra_kube_", "gpudra_task_", "process_", "python_")
#: Services whose metric names do not start with ``gpudra_<command>_``.
SERVICE_PREFIXES = {"nats-auth": "gpudra_nats_"}
DEFAULT_ADDRESS = "127.0.0.1"


class OwnMetrics(Collector):
    """The default registry's families that belong to ``service`` or the kernel."""

    def __init__(self, service: str, source: CollectorRegistry = REGISTRY) -> None:
        self.prefixes = (SERVICE_PREFIXES.get(service, f"gpudra_{service}_"), *KERNEL_PREFIXES)
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            if family.name.startswith(self.prefixes):
                yield family


def registry_for(service: str, source: CollectorRegistry = REGISTRY) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OwnMetrics(service, source))
    return registry


def serve(port: int, service: str, address: str = DEFAULT_ADDRESS) -> None:
    """Expose ``service``'s /metrics on ``address``:``port`` (port 0: off)."""
    if port:
        start_http_server(port, addr=address, registry=registry_for(service))


def trace_exemplar(trace_id: str) -> dict[str, str] | None:
    """The exemplar that links an observation to its trace (None without one)."""
    return {"trace_id": trace_id} if trace_id and set(trace_id) != {"0"} else None
