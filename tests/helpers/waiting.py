"""Waiting for what a test asserts: the condition itself, polled, never a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def until(
    check: Callable[[], Awaitable[T]], what: str, timeout: float = ..., every: float = ...
) -> T: ...


@overload
async def until(
    check: Callable[[], T], what: str, timeout: float = ..., every: float = ...
) -> T: ...


async def until(
    check: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.05
) -> Any:
    """``check()``'s first truthy value (awaited when it is a coroutine); AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)
