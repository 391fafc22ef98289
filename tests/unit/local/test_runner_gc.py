"""A service's startup objects are frozen out of the collector once it has started."""

from __future__ import annotations

import asyncio
import gc

import pytest

from services.core.process import runner


async def test_startup_objects_are_frozen_once_the_service_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "FREEZE_AFTER_S", 0.01)
    gc.unfreeze()
    startup = [object() for _ in range(3)]  # noqa: F841 - alive when the freeze comes

    async def service() -> int:
        await asyncio.sleep(0.1)
        return 0

    try:
        assert await runner._main(service()) == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
