"""The client request budget: bursts up to ``burst``, then ``qps`` a second (on a fake clock)."""

from __future__ import annotations

import pytest

from services.core.kit.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_a_burst_goes_at_once_then_the_rate_holds(clock: Clock) -> None:
    bucket = TokenBucket(qps=10, burst=5, clock=clock.monotonic, sleep=clock.sleep)
    for _ in range(5):
        await bucket.acquire()
    assert clock.slept == []
    for _ in range(10):
        await bucket.acquire()
    assert clock.slept == pytest.approx([0.1] * 10)  # one token per 1/qps
    clock.now += 60  # idle: the bucket refills, but only to the burst
    for _ in range(6):
        await bucket.acquire()
    assert len(clock.slept) == 11


async def test_no_budget_never_waits(clock: Clock) -> None:
    bucket = TokenBucket(qps=0, clock=clock.monotonic, sleep=clock.sleep)
    for _ in range(1000):
        await bucket.acquire()
    assert clock.slept == []
