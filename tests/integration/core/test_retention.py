"""The bus stays bounded: streams keep their limits, and keys that come and go leave nothing.

10,000 claims put into and deleted from the ``claims`` bucket (as the claim
watcher does over a claim's life) used to leave 9,780 delete markers for 5 live
keys; their markers now expire. The streams carry their age, size and
message-size limits, also after a restart with other settings.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from services.core.bus import retention, subjects
from services.core.bus.client import Bus
from services.core.model.schemas import PluginPresence
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect

pytestmark = pytest.mark.integration

CYCLES = 10_000


async def stored_messages(bus: Bus, bucket: str) -> int:
    return (await bus.js.stream_info(f"KV_{bucket}")).state.messages


async def test_ten_thousand_cycles_leave_the_claims_bucket_bounded(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Bus, "delete_marker_ttl", 2.0)
    bus = await connect(nats_server, name="soak")
    try:
        value = PluginPresence(node="n", driver="gpu.nvidia.com", endpoint="/x")
        live = [f"n.live-{i}" for i in range(5)]
        for key in live:
            await bus.kv_put(subjects.CLAIMS_BUCKET, key, value)
        for start in range(0, CYCLES, 500):
            keys = [f"n.claim-{i}" for i in range(start, start + 500)]
            await asyncio.gather(*(bus.kv_put(subjects.CLAIMS_BUCKET, k, value) for k in keys))
            await asyncio.gather(*(bus.kv_delete(subjects.CLAIMS_BUCKET, k) for k in keys))
        deadline = time.monotonic() + 60
        while (count := await stored_messages(bus, subjects.CLAIMS_BUCKET)) > len(live):
            assert time.monotonic() < deadline, f"{count} messages left for {len(live)} live keys"
            await asyncio.sleep(0.5)
        assert sorted(await bus.kv_keys(subjects.CLAIMS_BUCKET)) == live
    finally:
        await bus.close()


async def test_streams_carry_their_limits_and_follow_a_changed_setting(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = await connect(nats_server, name="limits")
    try:
        info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
        defaults = retention.DEFAULTS[subjects.CLAIMS_STREAM]
        assert info.config.max_age == defaults.max_age_s
        assert info.config.max_bytes == defaults.max_bytes
        assert info.config.max_msg_size == defaults.max_msg_size
        kv = await bus.js.stream_info(f"KV_{subjects.CLAIMS_BUCKET}")
        assert kv.config.max_msg_size == retention.DEFAULTS[subjects.CLAIMS_BUCKET].max_msg_size
    finally:
        await bus.close()
    monkeypatch.setenv("GPUDRA_CLAIMS_MAX_AGE", "7d")
    monkeypatch.setenv("GPUDRA_CLAIMS_MAX_BYTES", "64Mi")
    bus = await connect(nats_server, name="limits-again")
    try:
        info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
        assert info.config.max_age == 7 * retention.DAY
        assert info.config.max_bytes == 64 * retention.MIB
    finally:
        await bus.close()
    monkeypatch.setenv("GPUDRA_CLAIMS_MAX_AGE", "a week")
    with pytest.raises(
        retention.RetentionError, match="GPUDRA_CLAIMS_MAX_AGE: expected a duration"
    ):
        retention.limits(subjects.CLAIMS_STREAM)


def test_a_stream_and_the_bucket_of_the_same_name_have_their_own_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUDRA_KV_CLAIMS_MAX_BYTES", "8Mi")
    assert retention.limits(subjects.CLAIMS_BUCKET).max_bytes == 8 * retention.MIB
    assert retention.limits(subjects.CLAIMS_STREAM).max_bytes == retention.GIB
