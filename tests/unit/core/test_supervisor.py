"""Supervised tasks: failures counted and restarted with backoff; a fatal one stops the process."""

from __future__ import annotations

import asyncio

import pytest

from services.core.kit import supervisor
from services.core.kit.supervisor import TASK_RESTARTS, Supervisor


async def test_a_failing_task_is_counted_and_restarted_with_growing_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pauses are the backoff's own (recorded where it sleeps, so a loaded machine's
    scheduling delays cannot make them look otherwise): 0.1 s, then twice that."""
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay: float) -> None:
        pauses.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", recorded)  # what backoff.Backoff.sleep awaits
    tasks = Supervisor()
    runs = 0
    third = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            third.set()
            await asyncio.Event().wait()  # healthy from now on
        raise RuntimeError("boom")

    before = TASK_RESTARTS.labels(task="flaky")._value.get()
    tasks.spawn("flaky", flaky)
    await asyncio.wait_for(third.wait(), 5)
    assert TASK_RESTARTS.labels(task="flaky")._value.get() == before + 2
    assert pauses == [0.1, 0.2]
    assert not tasks.stopped.is_set() and tasks.failure is None
    await tasks.close()
    assert tasks.tasks == {}


async def test_a_task_that_returns_is_started_again() -> None:
    tasks = Supervisor()
    runs = 0
    again = asyncio.Event()

    async def short() -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            again.set()
            await asyncio.Event().wait()

    tasks.spawn("short", short)
    await asyncio.wait_for(again.wait(), 5)
    await tasks.close()


async def test_a_fatal_failure_stops_the_process_with_the_reason() -> None:
    tasks = Supervisor()

    async def doomed() -> None:
        raise OSError("the API server went away")

    tasks.spawn("watcher", doomed, fatal=True)
    await asyncio.wait_for(tasks.stopped.wait(), 5)
    assert tasks.failure == "task watcher OSError: the API server went away"


async def test_close_cancels_everything_and_waits_for_it() -> None:
    tasks = Supervisor()
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    tasks.spawn("a", lambda: forever("a"))
    tasks.spawn("b", lambda: forever("b"))
    await asyncio.sleep(0)
    await tasks.close()
    assert sorted(cleaned) == ["a", "b"]


async def test_a_task_that_swallows_its_cancel_is_cancelled_again() -> None:
    """Python 3.11's asyncio.wait_for returns its result when the cancel lands in the
    turn that result came in (nats-py's requests use it): the task goes on to its next
    wait. Cancelled once, the holdings task of a preparer never ended on SIGTERM."""
    tasks = Supervisor()
    reply: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    dirty = asyncio.Event()
    dirty.set()
    replies: list[int] = []

    async def publish_on_change() -> None:
        while True:
            await dirty.wait()
            dirty.clear()
            replies.append(await asyncio.wait_for(reply, 5))

    task = tasks.spawn("holdings", publish_on_change)
    await asyncio.sleep(0)
    reply.set_result(1)  # the reply and the cancel in one turn
    await asyncio.wait_for(tasks.cancel("holdings"), 5)
    assert task.cancelled()
    assert replies == [1]  # the first cancel was swallowed: the loop went round again


async def test_one_name_one_task_and_one_supervisor_per_loop() -> None:
    tasks = supervisor.current()
    assert supervisor.current() is tasks

    async def idle() -> None:
        await asyncio.Event().wait()

    tasks.spawn("same", idle)
    with pytest.raises(ValueError, match="already running"):
        tasks.spawn("same", idle)
    await tasks.close()
