"""How every service process starts and stops, so each service's cli says only what it runs."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

from services.core import logs, metrics, tracing
from services.core.bus import Bus


def run(service: str, args: argparse.Namespace, main: Coroutine[Any, Any, int | None]) -> int:
    """JSON logs, tracing, metrics and bus settings from the common flags, then ``main``."""
    logs.setup(service, args.log_level)
    tracing.setup(service, args.otlp_endpoint)
    metrics.serve(args.metrics_port)
    Bus.default_replicas = args.nats_replicas
    try:
        return int(asyncio.run(main) or 0)
    finally:
        tracing.shutdown()


def stop_event() -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets: the service's cue to shut down cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def cancel_on_signals() -> None:
    """SIGTERM or SIGINT cancels the current task (for services that run until cancelled)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
