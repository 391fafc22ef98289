"""One way for every service to start and stop: connect, open, spawn, wait, close.

A service says what it runs in a ``start(stack)`` coroutine: the bus
(:meth:`Stack.bus`), the API server (:meth:`Stack.kube`), its supervised tasks
(:meth:`Stack.spawn`) and whatever else must be closed (:meth:`Stack.closing`).
:func:`serve` then waits for the stop cue (SIGTERM or SIGINT, or a fatal task) and
undoes everything in reverse order, on every path: a start that fails half-way
closes what it had opened, and a close that fails is logged and the rest still
closed. So a service's start-up is written once, in its ``app.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from services.core.bus.access import Identity
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.kube.client import HttpKubeApi, http_api
from services.core.process import runner

log = logging.getLogger(__name__)

Start = Callable[["Stack"], Awaitable[int | None]]


class Stack(contextlib.AsyncExitStack):
    """What a service opened, closed last-opened first when it stops."""

    def __init__(self, stop: asyncio.Event) -> None:
        super().__init__()
        self.stop = stop  # set to stop the service from inside (a task that knows it is done)

    async def bus(self, url: str, *, name: str, identity: Identity) -> Bus:
        bus = await Bus.connect(url, name=name, identity=identity)
        self.closing(bus.close, "the bus")
        return bus

    async def kube(self, kubeconfig: str | None, **options: Any) -> HttpKubeApi:
        """The API server (``kubeconfig`` empty or None: the pod's service account)."""
        api = await http_api(kubeconfig or None, **options)
        self.closing(api.close, "the API client")
        return api

    def spawn(self, name: str, work: supervisor.Work, *, fatal: bool = True) -> None:
        """A supervised task (:mod:`services.core.kit.supervisor`), cancelled at stop."""
        tasks = supervisor.current()
        tasks.spawn(name, work, fatal=fatal)
        self.closing(lambda: tasks.cancel(name), f"task {name}")

    def closing(self, close: Callable[[], Awaitable[Any]], what: str = "") -> None:
        """Await ``close()`` at stop, before whatever was opened earlier."""

        async def guarded() -> None:
            try:
                await close()
            except Exception:  # the rest must still be closed
                log.exception("closing failed", extra={"what": what or repr(close)})

        self.push_async_callback(guarded)


async def serve(service: str, start: Start) -> int:
    """Start the service, serve until told to stop, close it; the exit status.

    ``start`` returns None to serve, or an exit status to end at once: non-zero to
    refuse to run (bad settings found late, after saying why), 0 when there is
    nothing to do. A stop cue while it is still starting (a bus not up yet: the
    connection is tried again and again) ends the start there. What it had opened
    is closed all the same."""
    stop = runner.stop_event()
    async with Stack(stop) as stack:
        code = await _started(start(stack), stop)
        if code is not None:
            return code
        log.info("running", extra={"service": service})
        await stop.wait()
        log.info("stopping", extra={"service": service})
    return 0


async def _started(starting: Awaitable[int | None], stop: asyncio.Event) -> int | None:
    """``starting``'s result, or 0 when ``stop`` comes first (the start is cancelled)."""
    start = asyncio.ensure_future(starting)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await supervisor.cancel_and_wait([stopped] if start.done() else [start, stopped])
    if not start.done() or start.cancelled():
        log.info("stopped while starting")
        return 0
    return start.result()


def main(service: str, args: Any, start: Start) -> int:
    """A service's whole process: :func:`runner.run` (logs, traces, metrics, the loop)
    around :func:`serve`."""
    return runner.run(service, args, serve(service, start))
