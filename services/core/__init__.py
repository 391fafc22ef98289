"""Shared code of every gpudra process, in layers: each imports only those below it
(pyproject.toml's import contract; tests/unit/project/test_import_contracts.py shows it breaks)::

    process     flags, the runner
    bus         subjects, identities, the NATS client, the claim trail
    telemetry   logs, metrics, traces
    model       NVIDIA devices, gates, shares, configs, ComputeDomains, bus schemas
    kube        the Kubernetes client, resource.k8s.io objects, quantities, names
    kit         backoff, limits, supervised tasks, environment

Importing this package imports nats-py's transports without aiohttp: nats-py
imports aiohttp (about 13 MB resident) only for ``ws://`` servers, which gpudra
never uses, and the front has no other use for it. aiohttp stays importable for
whoever needs it (the Kubernetes client, the tests): only nats-py's module-level
``import aiohttp`` is answered "not installed".
"""

from __future__ import annotations

import sys


def _nats_without_websockets() -> None:
    if "aiohttp" in sys.modules or "nats.aio.transport" in sys.modules:
        return  # too late, or already done
    sys.modules["aiohttp"] = None  # type: ignore[assignment]
    try:
        import nats.aio.transport  # noqa: F401
    finally:
        del sys.modules["aiohttp"]


_nats_without_websockets()
