"""Every long-running task of a process, watched: a failure is logged, counted and restarted.

A bare ``asyncio.create_task`` that fails stops silently (a KV watch that died
leaves the preparer with a stale mirror and no word in the logs). Tasks started
here are restarted with backoff when they raise or return, or, when declared
``fatal``, stop the whole process with a non-zero exit so that the orchestrator
restarts it. One :class:`Supervisor` belongs to each event loop (the process's);
:func:`current` finds it, so components need no plumbing to reach it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from prometheus_client import Counter

from services.core.kit.backoff import Backoff

log = logging.getLogger(__name__)

TASK_RESTARTS = Counter(
    "gpudra_task_restarts_total",
    "Long-running tasks restarted after they failed or ended, by task.",
    ["task"],
)
HEALTHY_AFTER_S = 60.0  # a task that ran this long before failing starts its backoff afresh
CANCEL_AGAIN_S = 0.5  # how long a cancelled task has before it is cancelled once more

Work = Callable[[], Awaitable[None]]


class Supervisor:
    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.failure: str | None = None  # why a fatal task stopped the process
        self.stopped = asyncio.Event()  # set by a fatal failure (or by the stop path)

    def spawn(self, name: str, work: Work, *, fatal: bool = False) -> asyncio.Task[None]:
        """Run ``work()`` until cancelled: restarted when it raises or returns (or fatal)."""
        if name in self.tasks and not self.tasks[name].done():
            raise ValueError(f"a task named {name!r} is already running")
        task = asyncio.get_running_loop().create_task(self._keep(name, work, fatal), name=name)
        self.tasks[name] = task
        return task

    async def _keep(self, name: str, work: Work, fatal: bool) -> None:
        backoff = Backoff()
        while True:
            started = time.monotonic()
            try:
                await work()
                reason = "ended"
                log.warning("task ended; restarting it", extra={"task": name})
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                log.exception("task failed", extra={"task": name, "fatal": fatal})
            if fatal:
                self.failure = f"task {name} {reason}"
                self.stopped.set()
                return
            TASK_RESTARTS.labels(task=name).inc()
            if time.monotonic() - started > HEALTHY_AFTER_S:
                backoff.reset()
            await backoff.sleep()

    def fail(self, reason: str) -> None:
        """Stop the process as a fatal task's failure does (exit 1), for what is no task:
        e.g. a bus connection its client closed for good."""
        if self.failure is None:
            self.failure = reason
        self.stopped.set()

    async def cancel(self, name: str) -> None:
        task = self.tasks.pop(name, None)
        if task is not None:
            await cancel_and_wait([task])

    async def close(self) -> None:
        """Cancel every task and wait until each has finished."""
        tasks = list(self.tasks.values())
        self.tasks.clear()
        await cancel_and_wait(tasks)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has finished, whatever it raised.

    Cancelling once is not enough on Python 3.11: ``asyncio.wait_for`` (inside
    nats-py's request, flush and publish) returns its result instead of raising
    when the cancel lands in the loop turn its awaitable finished in (CPython
    gh-86296), and the task goes on to its next wait. A preparer whose holdings
    task swallowed its cancel that way never exited on SIGTERM. So a task still
    running after :data:`CANCEL_AGAIN_S` is cancelled again.
    """
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: asyncio logs an unretrieved one at exit


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Supervisor] = (
    weakref.WeakKeyDictionary()
)


def current() -> Supervisor:
    """The running loop's supervisor (made on first use)."""
    loop = asyncio.get_running_loop()
    found = _BY_LOOP.get(loop)
    if found is None:
        found = _BY_LOOP[loop] = Supervisor()
    return found
