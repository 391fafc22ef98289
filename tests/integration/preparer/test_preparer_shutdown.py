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

from services.core.bus.failures import RequestFailed
from services.core.model import nvidia
from services.core.model.schemas import NodeReply
from tests.helpers.discovery import wait_logged
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


async def test_a_second_preparer_waits_for_the_first_and_takes_over(node: Node) -> None:
    """A rolling update starts the new node pod beside the old one: its preparer waits
    for the node's lock (it never exits into a crash-loop back-off) and serves the
    moment the old one has stopped; a waiting one told to stop exits 0 at once."""
    await node.start_discovery()
    first = await node.start_preparer()
    second = await node.start_preparer(ready=False)
    third = await node.start_preparer(ready=False)
    for waiting in (second, third):
        await wait_logged(waiting.log, "another preparer holds the node's lock")
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")]))
    reply = await node.prepare(claim)  # the first one still serves
    assert reply.claims[ref(claim).uid].error == "", reply

    assert await asyncio.to_thread(third.stop) == 0, third.output()
    assert second.alive(), second.output()
    assert await asyncio.to_thread(first.stop) == 0, first.output()
    await node.wait_preparer(second)
    await wait_logged(second.log, "this one takes over")
    # The second one recovered the first one's claim from the checkpoint.
    reply = await node.unprepare(claim)
    assert reply.claims[ref(claim).uid].error == "", reply
    assert not node.cdi_files()
