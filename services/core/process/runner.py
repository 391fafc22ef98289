"""How every service process starts and stops, so each service's cli says only what it runs.

One stop path per process: SIGTERM or SIGINT, or a fatal supervised task
failing, sets :func:`stop_event`; the service then stops taking work, lets what
is running finish, flushes its sinks and closes the bus; then every task still
supervised is cancelled and the process exits (1 if a fatal task failed).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.process import config
from services.core.telemetry import logs, metrics, tracing

log = logging.getLogger(__name__)


def run(service: str, args: argparse.Namespace, main: Coroutine[Any, Any, int | None]) -> int:
    """JSON logs, tracing, metrics and bus settings from the common flags, then ``main``."""
    logs.setup(service, args.log_level)
    try:
        tracing.setup(service, args.otlp_endpoint)
    except tracing.TracingConfigError as exc:
        log.error("bad tracing settings", extra={"error": str(exc)})
        return 2
    metrics.serve(args.metrics_port, service, args.metrics_address)
    Bus.default_replicas = args.nats_replicas
    Bus.default_credentials = config.nats_credentials(args)
    Bus.max_inflight = args.max_inflight
    try:
        with asyncio.Runner(loop_factory=loop_factory(getattr(args, "event_loop", ""))) as loop:
            return loop.run(_main(main))
    finally:
        tracing.shutdown()


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when asked for (``--event-loop uvloop``); None: asyncio's own.

    asyncio's is the default by the figures in docs/operations.md (Performance):
    uvloop saved CPU in a gRPC server alone, but not on the whole claim path."""
    if name != "uvloop":
        return None
    import uvloop

    return uvloop.new_event_loop


#: When a service has started: its modules, classes and long-lived state exist by then.
FREEZE_AFTER_S = 3.0


def _freeze_startup_objects() -> None:
    """Move what exists now out of the collector's reach: those objects live as long as
    the process, and each full collection walked them all (7-8 ms in the front and the
    preparer, about a claim's whole prepare at p50, a few times per thousand claims)."""
    gc.collect()
    gc.freeze()


async def _main(main: Coroutine[Any, Any, int | None]) -> int:
    tasks = supervisor.current()
    asyncio.get_running_loop().call_later(FREEZE_AFTER_S, _freeze_startup_objects)
    try:
        code = int(await main or 0)
    finally:
        await tasks.close()
    if tasks.failure is not None:
        log.error("stopped by a fatal task", extra={"reason": tasks.failure})
        return code or 1
    return code


def stop_event() -> asyncio.Event:
    """Set by SIGTERM or SIGINT, or by a fatal supervised task: the one cue to shut down."""
    stop = supervisor.current().stopped
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
