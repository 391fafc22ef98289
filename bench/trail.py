"""Benchmark: what numbering claim events per claim costs (services/core/bus/claimtrail.py).

Against a real nats-server (TLS, the production permissions) on 127.0.0.1, prints
without asserting anything:

1. plain: one JetStream publish per event (what events cost before numbering);
2. numbered, one emitter per claim: ``ClaimTrail.append`` (the claim's last number is
   remembered: one publish per event after the first read);
3. numbered, contended: an allocator and a preparer identity appending to the same
   claims at once (each refusal costs a read and another publish);

each with p50/p99 latency per event, events/s over ``--claims`` claims of
``--events`` events (claims concurrently), and the process's peak RSS.
Usage: ``python bench/trail.py [--claims 200] [--events 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.claimtrail import ClaimTrail
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, ClaimRef
from services.local.natsserver import NatsServer

NAMES = ("allocated", "reserved", "prepare.requested", "prepared", "unprepare.requested",
         "unprepared", "released", "deleted")  # fmt: skip


def event(ref: ClaimRef, i: int) -> ClaimEvent:
    return ClaimEvent(event=NAMES[i % len(NAMES)], claim=ref, node="n1", actor="bench")  # type: ignore[arg-type]


async def run(
    label: str, claims: int, events: int, one: Callable[[ClaimRef, int], Awaitable[None]]
) -> None:
    latencies: list[float] = []

    async def claim(c: int) -> None:
        ref = ClaimRef(uid=f"{label}-{c}", namespace="bench", name=f"c{c}")
        for i in range(events):
            started = time.perf_counter()
            await one(ref, i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(claim(c) for c in range(claims)))
    took = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100)
    print(f"{label:28} p50 {q[49] * 1e3:7.2f} ms  p99 {q[98] * 1e3:7.2f} ms  "
          f"{len(latencies) / took:8.0f} events/s")  # fmt: skip


async def main(claims: int, events: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        try:
            server.provision()
            admin = await connect(server, Role.ADMIN)
            allocator = await connect(server, Role.ALLOCATOR)
            preparer = await connect(server, Role.PREPARER, "n1")

            async def plain(ref: ClaimRef, i: int) -> None:
                subject = subjects.claim_event(ref.namespace, ref.name, ref.uid, "n1", NAMES[i % 8])
                await admin.js_publish(subject, event(ref, i), {"Nats-Msg-Id": f"{ref.uid}/{i}"})

            alone = ClaimTrail(admin)  # every event name (permissions are not measured here)

            async def numbered(ref: ClaimRef, i: int) -> None:
                await alone.append(event(ref, i), f"{ref.uid}/{i}")

            a, p = ClaimTrail(allocator), ClaimTrail(preparer)

            async def racing(ref: ClaimRef, i: int) -> None:
                await asyncio.gather(
                    a.append(event(ref, 1), f"{ref.uid}/{i}/a"),  # reserved
                    p.append(event(ref, 3), f"{ref.uid}/{i}/p"),  # prepared
                )

            await run("plain publish", claims, events, plain)
            await run("numbered, one emitter", claims, events, numbered)
            await run("numbered, two racing (pairs)", claims, events // 2, racing)
            for bus in (admin, allocator, preparer):
                await bus.close()
        finally:
            server.stop()
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


async def connect(server: NatsServer, role: Role, node: str = "") -> Bus:
    return await Bus.connect(
        server.url, name="bench", identity=Identity(role, node),
        credentials=server.credentials(role, node),
    )  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--events", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.claims, args.events))
