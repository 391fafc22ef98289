"""Discovery processes and the bus as tests see them.

Wait for inventories, collect events, run ``gpudra`` commands.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.bus.failures import RequestFailed
from services.core.model.schemas import (
    NodeInventory,
    SimMigReply,
    SimMigRequest,
)
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect

ROOT = Path(__file__).resolve().parents[2]

NODE = "node.a"  # a dot: must be escaped in subjects and keys


T = TypeVar("T")


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def inventory(bus: Bus, node: str = NODE) -> tuple[NodeInventory, int] | None:
    return await bus.kv_get(subjects.INVENTORY_BUCKET, subjects.inventory_key(node), NodeInventory)


async def wait_inventory(
    bus: Bus, check: Callable[[NodeInventory], bool], timeout: float = 60.0
) -> tuple[NodeInventory, int]:
    deadline = time.monotonic() + timeout
    while True:
        found = await inventory(bus)
        if found is not None and check(found[0]):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"inventory never matched within {timeout}s; last: {found}")
        await asyncio.sleep(0.02)


async def collect(bus: Bus, subject: str, kind: type[T]) -> list[T]:
    """Every message on ``subject`` from now on, decoded as ``kind``."""
    seen: list[T] = []

    async def on(value: T, _headers: dict[str, str]) -> None:
        seen.append(value)

    await bus.subscribe(subject, kind, on)
    return seen


async def wait_for(seen: list[T], check: Callable[[list[T]], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check(seen):
        if time.monotonic() > deadline:
            raise AssertionError(f"never seen within {timeout}s: {seen}")
        await asyncio.sleep(0.02)


async def wait_logged(log: Path, *lines: str, timeout: float = 60.0) -> None:
    """Wait until a process's log holds every one of ``lines`` (a message it writes)."""
    deadline = time.monotonic() + timeout
    while True:
        text = await asyncio.to_thread(log.read_text)
        if all(line in text for line in lines):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{log.name} never logged {lines} within {timeout}s:\n{text}")
        await asyncio.sleep(0.02)


async def until_serving(server: NatsServer, timeout: float = 30.0) -> None:
    """Wait until a discovery process answers simulated-NVML requests for NODE (asked
    as `gpudra sim` asks: discovery answers only its requesters)."""
    probe = SimMigRequest(op="mig-mode", gpu_uuid="GPU-probe", mig_enabled=True)
    sim = await connect(server, Role.SIM, name="until-serving")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                await sim.request(subjects.sim_control(NODE), probe, SimMigReply, timeout=1)
                return
            except RequestFailed:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await sim.close()


async def gpudra(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()
