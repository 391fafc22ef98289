"""Per-key locks of the preparer's engines (services/preparer/keylocks.py)."""

from __future__ import annotations

import asyncio

from services.preparer.keylocks import KeyedLocks


async def test_one_holder_per_key_and_no_lock_kept_after() -> None:
    locks, order = KeyedLocks(), []

    async def use(key: str, name: str) -> None:
        async with locks.hold(key):
            order.append(f"{name}+")
            await asyncio.sleep(0.01)
            order.append(f"{name}-")

    await asyncio.gather(use("a", "1"), use("a", "2"), use("b", "3"))
    assert order.index("1-") < order.index("2+")  # the same key waits
    assert order.index("3+") < order.index("1-")  # another key does not
    assert len(locks) == 0


async def test_hold_all_holds_every_key_until_it_ends() -> None:
    locks, order = KeyedLocks(), []

    async def both() -> None:
        async with locks.hold_all({"gpu-b", "gpu-a"}):
            order.append("both+")
            await asyncio.sleep(0.02)
            order.append("both-")

    async def one(key: str) -> None:
        await asyncio.sleep(0.005)  # after both() took its keys
        async with locks.hold(key):
            order.append(key)

    await asyncio.gather(both(), one("gpu-a"), one("gpu-b"), one("gpu-c"))
    assert order[0] == "both+" and order[1] == "gpu-c" and order[2] == "both-"
    assert sorted(order[3:]) == ["gpu-a", "gpu-b"] and len(locks) == 0
