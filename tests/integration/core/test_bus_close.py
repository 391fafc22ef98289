"""A watch cancelled while it is being made (a SIGTERM in a service's first
milliseconds) leaves nothing behind that the bus's close would wait for."""

from __future__ import annotations

import asyncio

import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.bus.ordered import settle
from services.core.model.schemas import PluginPresence
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect

pytestmark = pytest.mark.integration


async def test_a_watch_cancelled_while_it_is_made_leaves_no_subscription(
    nats_server: NatsServer,
) -> None:
    """Cancelled at every moment of its making (0 to 10 ms in 0.25 ms steps): with
    nats-py's watch, one cancelled after its subscribe kept the subscription, whose
    callback waited 5 s for a setup that never came, and the close's drain with it."""
    for step in range(40):
        bus = await connect(nats_server)
        p = PluginPresence(node="n1", driver="gpu.nvidia.com", endpoint="/x")
        await bus.kv_put(subjects.PRESENCE_BUCKET, "n1", p)
        await bus.kv(subjects.PRESENCE_BUCKET)
        before = set(bus.nc._subs)

        async def watch(bus: Bus = bus) -> None:
            async for _ in bus.watch_kv(subjects.PRESENCE_BUCKET, PluginPresence):
                pass

        task = asyncio.create_task(watch())
        await asyncio.sleep(step / 4000)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2)
        assert done, f"a watch cancelled after {step / 4} ms did not end"
        await settle()
        assert set(bus.nc._subs) == before, f"cancelled after {step / 4} ms"
        closing = asyncio.create_task(bus.close())
        done, _ = await asyncio.wait([closing], timeout=3)
        assert done, f"close hung after a watch cancelled after {step / 4} ms"
