"""SIGTERM while prepares are in flight: every answered prepare's event reaches the CLAIMS stream.

The preparer stops taking requests, lets the running ones answer, flushes their
lifecycle events and exits 0. A kubelet that got a successful reply can count
on the audit trail saying so; a request that was never taken fails for the
caller (and the kubelet retries), it is never half done.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from services.core import nvidia
from services.core.bus import RequestFailed
from services.core.schemas import NodeReply
from tests.helpers.events import stored_claim_events
from tests.helpers.preparer import Dev, Node, make_claim, ref

pytestmark = pytest.mark.integration


async def test_sigterm_mid_prepare_loses_no_event_of_an_answered_prepare(node: Node) -> None:
    # Dynamic MIG devices: each prepare creates one through discovery's NVML, so
    # prepares take long enough to be caught running by the signal.
    preparer = await node.start_preparer(gates="DynamicMIG=true")
    claims = []
    for gpu in range(8):
        for start in (0, 2, 4):
            mig = nvidia.mig_device_name(gpu, "2g.20gb", 14, start)
            claim = make_claim(node.name, [Dev("slice", mig)], name=f"c{gpu}-{start}")
            claims.append(await node.put_claim(claim))
    calls = [asyncio.create_task(node.request("prepare", [ref(c)], timeout=10)) for c in claims]
    await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
    os.kill(preparer.popen.pid, signal.SIGTERM)  # the rest are queued or running
    done = await asyncio.gather(*calls, return_exceptions=True)

    assert await asyncio.to_thread(preparer.wait, 30) == 0, preparer.output()
    answered = {
        uid
        for r in done
        if isinstance(r, NodeReply)
        for uid, result in r.claims.items()
        if not result.error
    }
    assert answered, done
    assert all(isinstance(r, NodeReply | RequestFailed) for r in done), done
    prepared = {e.claim.uid for e in await stored_claim_events(node.bus) if e.event == "prepared"}
    assert answered <= prepared, f"answered without an event: {answered - prepared}"
