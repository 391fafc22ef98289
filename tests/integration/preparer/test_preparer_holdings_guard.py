"""The preparer's guard of its prepared key leaves its own record alone.

The guard compares the stored record with what it wrote; the record carries the
time it was written, so comparing whole records found every intact key
"rewritten": each node's preparer put its key back (a KV write, a warning and a
repair counted) every check, forever.
"""

from __future__ import annotations

from pathlib import Path

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.model.schemas import HeldDevice, NodePreparedDevices
from services.local.natsserver import NatsServer
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.holdings import REPAIRS, HoldingsPublisher
from tests.helpers.bus import connect
from tests.helpers.waiting import until

NODE = "node-a"


def repairs(reason: str) -> float:
    return float(REPAIRS.labels(reason=reason)._value.get())


async def test_an_intact_key_is_not_rewritten_and_a_changed_one_is_put_back(
    tmp_path: Path, nats_server: NatsServer, bus: Bus
) -> None:
    preparer = await connect(nats_server, Role.PREPARER, NODE)
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="boot")
    store.load()
    holdings = HoldingsPublisher(preparer, NODE, store, check_s=0.05)
    key = subjects.prepared_key(NODE)
    before = repairs("rewritten")
    try:
        holdings.start()
        written = await until(
            lambda: bus.kv_get(subjects.PREPARED_BUCKET, key, NodePreparedDevices), "key written"
        )
        checks = holdings.checks
        await until(lambda: holdings.checks >= checks + 5, "five checks of the intact key")
        now = await bus.kv_get(subjects.PREPARED_BUCKET, key, NodePreparedDevices)
        assert written is not None and now is not None
        assert now[1] == written[1], "the intact key was written again"
        assert repairs("rewritten") == before

        held = HeldDevice(device="gpu-0", kind="gpu", pci_bus_id="0000:01:00.0", claim_uid="u")
        forged = await bus.kv_put(
            subjects.PREPARED_BUCKET, key, NodePreparedDevices(node=NODE, devices=[held])
        )

        async def put_back() -> bool:
            got = await bus.kv_get(subjects.PREPARED_BUCKET, key, NodePreparedDevices)
            return got is not None and got[1] > forged and got[0].devices == []

        await until(put_back, "the rewritten key put back")
        assert repairs("rewritten") == before + 1
    finally:
        await holdings.close()
        await preparer.close()
