"""Discovery's rescan puts its inventory back when the key is gone or changed unseen.

The guard's watch sees a deletion (a delete marker) or a rewrite at once; a key that
left without its watch seeing it (removed while the watch was down, the marker since
expired) is found at the next rescan, which compares what KV holds with the scan.
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.core.bus import subjects
from services.core.model.schemas import NodeInventory, decode, encode
from services.discovery import metrics
from services.discovery.fleet import get_fleet
from services.discovery.service import Discovery
from services.discovery.sim import SimNvml


class FakeBus:
    """The part of the bus discovery writes its inventory through, as a dict."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}
        self.puts = 0

    async def kv_put(self, bucket: str, key: str, value: msgspec.Struct) -> int:
        self.kv[f"{bucket}/{key}"] = encode(value)
        self.puts += 1
        return self.puts

    async def kv_get(self, bucket: str, key: str, kind: type[Any]) -> tuple[Any, int] | None:
        raw = self.kv.get(f"{bucket}/{key}")
        return None if raw is None else (decode(raw, kind), self.puts)

    async def publish(self, subject: str, value: msgspec.Struct) -> None:
        pass


async def test_a_key_gone_unseen_is_put_back_at_the_next_rescan() -> None:
    bus = FakeBus()
    sim = SimNvml.boot("node-a", get_fleet("dgx-h100"), 0)
    discovery = Discovery(bus, "node-a", sim)  # type: ignore[arg-type]
    sim.init()
    await discovery._rescan()
    key = f"{subjects.INVENTORY_BUCKET}/{subjects.inventory_key('node-a')}"
    assert bus.puts == 1 and key in bus.kv
    await discovery._rescan()  # nothing changed: nothing written
    assert bus.puts == 1
    before = metrics.INVENTORY_REPAIRS._value.get()
    del bus.kv[key]  # gone without a watch event
    await discovery._rescan()
    assert bus.puts == 2 and decode(bus.kv[key], NodeInventory).node == "node-a"
    forged = msgspec.structs.replace(decode(bus.kv[key], NodeInventory), gpus=[])
    bus.kv[key] = encode(forged)
    await discovery._rescan()
    assert decode(bus.kv[key], NodeInventory).gpus
    assert metrics.INVENTORY_REPAIRS._value.get() == before + 2
