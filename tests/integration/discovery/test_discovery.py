"""Discovery as its own process against a real nats-server, driven as other processes drive it."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.model.schemas import (
    HealthEvent,
    InventoryChanged,
    MigDevice,
    SimMigReply,
    SimMigRequest,
)
from services.discovery import backend as nv
from services.discovery.fleet import get_fleet
from services.discovery.metrics import SIM_CONFLICTS
from services.discovery.simstate import encode_state
from services.discovery.simstore import SimStore, sim_key
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect
from tests.helpers.discovery import (
    NODE,
    collect,
    gpudra,
    inventory,
    stop,
    until_serving,
    wait_for,
    wait_inventory,
    wait_logged,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

Start = Callable[..., Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def start_discovery(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Start]:
    procs: list[asyncio.subprocess.Process] = []

    async def start(fleet: str = "dgx-a100", node: str = NODE) -> asyncio.subprocess.Process:
        log = (tmp_path / f"discovery-{len(procs)}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.cli", "discovery"),
            *nats_server.client_argv(Role.DISCOVERY, node),
            *("--node-name", node, "--fleet", fleet, "--rescan-interval", "300"),
            cwd=ROOT,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        await stop(proc)
    # SIGTERM is a clean shutdown, never a crash
    assert [p.returncode for p in procs] == [0] * len(procs), (
        tmp_path / "discovery-0.log"
    ).read_text()


async def test_inventory_follows_mig_create_and_destroy(bus: Bus, start_discovery: Start) -> None:
    changes = await collect(bus, subjects.inventory_changed(NODE), InventoryChanged)
    await start_discovery("dgx-a100")
    inv, _ = await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    assert inv.backend == "simulated:dgx-a100" and inv.node == NODE
    assert [len(g.mig_devices) for g in inv.gpus] == [0, 0, 0, 0, 3, 7, 2, 4]
    await wait_for(changes, lambda s: len(s) == 1)
    assert changes[0].changes == ["inventory created: 8 GPUs (simulated:dgx-a100)"]

    store = SimStore(bus)
    created = await store.create_mig_device(NODE, 0, "3g.20gb", 4)
    started = time.monotonic()
    inv, revision = await wait_inventory(
        bus, lambda i: [m.uuid for m in i.gpus[0].mig_devices] == [created.uuid], timeout=1.0
    )
    shown_after = time.monotonic() - started
    assert inv.gpus[0].mig_enabled and inv.gpus[0].mig_devices == [created]
    await wait_for(changes, lambda s: len(s) == 2)
    assert changes[1].revision == revision and changes[1].digest == inv.digest()
    assert changes[1].changes == [
        "gpu-0: MIG mode enabled",
        f"gpu-0: MIG 3g.20gb created at 4 (GI 2, {created.uuid})",
    ]
    print(f"MIG create visible in KV after {shown_after * 1000:.0f} ms")

    await store.destroy_mig_device(NODE, 0, created.gi_id, created.ci_id)
    await wait_inventory(bus, lambda i: i.gpus[0].mig_devices == [])
    await wait_for(changes, lambda s: len(s) == 3)
    assert changes[2].changes == ["gpu-0: MIG 3g.20gb destroyed at 4 (GI 2)"]


async def test_xid_and_lost_gpu_from_the_cli(
    bus: Bus, nats_server: NatsServer, start_discovery: Start
) -> None:
    sim = nats_server.client_argv(Role.SIM)
    health = await collect(bus, subjects.health(NODE), HealthEvent)
    await start_discovery("dgx-a100")
    inv, _ = await wait_inventory(bus, lambda i: len(i.gpus) == 8)

    rc, out = await gpudra("sim", "xid", *sim, "--node", NODE, "--gpu", "3", "--xid", "79")
    assert rc == 0, out
    await wait_for(health, lambda s: len(s) == 1)
    event = health[0]
    assert (event.kind, event.xid, event.gpu_index, event.gpu_uuid) == (
        "xid",
        79,
        3,
        inv.gpus[3].uuid,
    )
    after, _ = await wait_inventory(bus, lambda i: bool(i.gpus[3].health.xids))
    assert [x.xid for x in after.gpus[3].health.xids] == [79]
    assert all(not g.health.xids for g in after.gpus if g.index != 3)

    mig = inv.gpus[5].mig_devices[2]
    rc, out = await gpudra(
        *("sim", "xid", *sim, "--node", NODE, "--gpu", "5", "--xid", "43"),
        *("--gi", str(mig.gi_id), "--ci", str(mig.ci_id)),
    )
    assert rc == 0, out
    await wait_for(health, lambda s: len(s) == 2)
    assert mig.uuid in health[1].message
    after, _ = await wait_inventory(bus, lambda i: bool(i.gpus[5].health.xids))
    assert (after.gpus[5].health.xids[0].gi_id, after.gpus[5].health.xids[0].ci_id) == (
        mig.gi_id,
        mig.ci_id,
    )

    rc, out = await gpudra("sim", "lose", *sim, "--node", NODE, "--gpu", "6")
    assert rc == 0, out
    await wait_for(health, lambda s: len(s) == 3)
    assert (health[2].kind, health[2].gpu_index) == ("gpu-lost", 6)
    lost, _ = await wait_inventory(bus, lambda i: i.gpus[6].health.lost)
    assert lost.gpus[6].uuid == inv.gpus[6].uuid and lost.gpus[6].error
    assert [g.index for g in lost.gpus if g.error] == [6]  # the other GPUs are untouched
    assert lost.gpus[6].mig_devices == inv.gpus[6].mig_devices  # last known, for tainting

    rc, out = await gpudra("sim", "recover", *sim, "--node", NODE, "--gpu", "6")
    assert rc == 0, out
    await wait_for(health, lambda s: len(s) == 4)
    assert (health[3].kind, health[3].gpu_index) == ("recovered", 6)
    await wait_inventory(bus, lambda i: not i.gpus[6].health.lost and i.gpus[6].error is None)

    rc, out = await gpudra("sim", "xid", *sim, "--node", NODE, "--gpu", "9", "--xid", "1")
    assert rc == 1 and "NVML_ERROR_INVALID_ARGUMENT: no GPU 9" in out


async def test_malformed_sim_state_is_skipped(
    bus: Bus, start_discovery: Start, tmp_path: Path
) -> None:
    proc = await start_discovery("dgx-h100")
    before, revision = await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    store = SimStore(bus)
    found = await store.get(NODE)
    assert found is not None
    good_state = found[0]
    kv = await bus.kv(subjects.SIM_BUCKET)

    # One at a time: a watch that starts late sees only the key's last value.
    log = tmp_path / "discovery-0.log"
    await kv.put(sim_key(NODE), b"\xc1 not msgpack")
    await wait_logged(log, "skipping malformed message")  # the bus client: not msgpack
    broken = encode_state(good_state).replace(b"H100-SXM5-80GB", b"H999-SXM5-80GB")
    await kv.put(sim_key(NODE), broken)
    await wait_logged(log, "unknown GPU model 'H999-SXM5-80GB'")  # discovery skips the state
    assert proc.returncode is None
    assert await inventory(bus) == (before, revision)  # nothing changed

    await kv.put(sim_key(NODE), encode_state(good_state))
    created = await store.create_mig_device(NODE, 7, "7g.80gb")
    inv, _ = await wait_inventory(bus, lambda i: bool(i.gpus[7].mig_devices))
    assert inv.gpus[7].mig_devices == [created] and proc.returncode is None


async def test_mig_requests_over_the_bus(
    bus: Bus, nats_server: NatsServer, start_discovery: Start
) -> None:
    await start_discovery("h200x8")
    inv, _ = await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    gpu = inv.gpus[2]
    preparer = await connect(nats_server, Role.PREPARER, NODE, name="preparer")  # who asks
    try:

        async def ask(req: SimMigRequest) -> SimMigReply:
            return await preparer.request(subjects.sim_control(NODE), req, SimMigReply, timeout=10)

        reply = await ask(
            SimMigRequest(op="create", gpu_uuid=gpu.uuid, gi_profile_id=15, placement_start=6)
        )
        assert reply.error == "" and reply.device is not None
        assert (reply.device.profile, reply.device.gi_id, reply.device.placement.start) == (
            "1g.35gb",
            6,
            6,
        )
        inv, _ = await wait_inventory(bus, lambda i: bool(i.gpus[2].mig_devices))
        assert inv.gpus[2].mig_devices == [reply.device]

        clash = await ask(
            SimMigRequest(op="create", gpu_uuid=gpu.uuid, gi_profile_id=9, placement_start=4)
        )
        assert clash.nvml_error == "NVML_ERROR_INSUFFICIENT_RESOURCES" and clash.device is None
        missing = await ask(SimMigRequest(op="destroy", gpu_uuid="GPU-nope", gi_id=6, ci_id=0))
        assert missing.nvml_error == "NVML_ERROR_NOT_FOUND"
        incomplete = await ask(SimMigRequest(op="destroy", gpu_uuid=gpu.uuid))
        assert (
            incomplete.nvml_error == "NVML_ERROR_INVALID_ARGUMENT" and "gi_id" in incomplete.error
        )

        done = await ask(SimMigRequest(op="destroy", gpu_uuid=gpu.uuid, gi_id=6, ci_id=0))
        assert done.error == ""
        await wait_inventory(bus, lambda i: not i.gpus[2].mig_devices)
        off = await ask(SimMigRequest(op="mig-mode", gpu_uuid=gpu.uuid, mig_enabled=False))
        assert off.error == ""
        await wait_inventory(bus, lambda i: not i.gpus[2].mig_enabled)
    finally:
        await preparer.close()


async def test_restart_keeps_state_and_does_not_churn(
    bus: Bus, nats_server: NatsServer, start_discovery: Start
) -> None:
    sim = nats_server.client_argv(Role.SIM)
    first = await start_discovery("l4x4")
    await wait_inventory(bus, lambda i: len(i.gpus) == 4)
    rc, out = await gpudra(
        "sim",
        "mig",
        "create",
        *sim,
        "--node",
        NODE,
        "--gpu",
        "0",
        "--profile",
        "1g.10gb",
    )
    assert rc == 1 and "NVML_ERROR_NOT_SUPPORTED" in out  # L4 has no MIG
    await stop(first)
    inv, revision = await wait_inventory(bus, lambda i: len(i.gpus) == 4)

    changes = await collect(bus, subjects.inventory_changed(NODE), InventoryChanged)
    await start_discovery("l4x4")
    await until_serving(nats_server)
    rc, out = await gpudra("sim", "lose", *sim, "--node", NODE, "--gpu", "1")
    assert rc == 0, out
    await wait_for(changes, lambda s: len(s) >= 1)
    assert changes[0].revision == revision + 1 and changes[0].changes[0] == "gpu-1: lost"

    # `gpudra sim boot` with another fleet reboots the node into new hardware.
    rc, out = await gpudra("sim", "boot", *sim, "--node", NODE, "--fleet", "mixed")
    assert rc == 0 and '"fleet": "mixed"' in out
    rebooted, booted = await wait_inventory(bus, lambda i: i.backend == "simulated:mixed")
    await wait_for(changes, lambda s: s[-1].revision == booted)
    # Between the restart and the reboot only the loss was written.
    assert [c.revision for c in changes] == [revision + 1, revision + 2]
    assert changes[1].changes[0] == "backend: simulated:l4x4 -> simulated:mixed"
    assert rebooted.gpus[1].mig_enabled and {g.uuid for g in rebooted.gpus}.isdisjoint(
        g.uuid for g in inv.gpus
    )


async def test_concurrent_writers_never_lose_an_update(bus: Bus, nats_server: NatsServer) -> None:
    store, other = SimStore(bus), SimStore(await connect(nats_server, Role.SIM, name="writer-2"))
    try:
        state, revision = await store.boot(NODE, get_fleet("dgx-h100"), 0)
        assert await store.boot(NODE, get_fleet("dgx-h100"), 0) == (state, revision)  # kept
        conflicts = SIM_CONFLICTS._value.get()
        results = await asyncio.gather(
            *(s.create_mig_device(NODE, 0, "1g.10gb") for s in [store, other] * 4),
            return_exceptions=True,
        )
        made = [r for r in results if isinstance(r, MigDevice)]
        refused = [r for r in results if isinstance(r, nv.NvmlError)]
        assert len(made) == 7 and len(refused) == 1, results  # seven 1g slots, one too many
        assert isinstance(refused[0], nv.InsufficientResources)
        assert sorted(d.placement.start for d in made) == list(range(7))
        found = await store.get(NODE)
        assert found is not None
        assert sorted(gi.id for gi in found[0].gpus[0].gpu_instances) == list(range(7, 14))
        assert len({d.uuid for d in made}) == 7
        assert (
            SIM_CONFLICTS._value.get() > conflicts
        )  # the writers did collide, and CAS resolved it

        reseeded, _ = await store.boot(NODE, get_fleet("dgx-h100"), 1)  # another seed: a reboot
        assert reseeded.gpus[0].gpu_instances == [] and reseeded.gpus[0].uuid != state.gpus[0].uuid
    finally:
        await other.bus.close()


async def test_a_forged_or_deleted_inventory_is_put_back_by_the_nodes_discovery(
    bus: Bus, start_discovery: Start
) -> None:
    """Only the node's own discovery says what GPUs it has (16 fake H200s, or none, undone)."""
    await start_discovery("dgx-h100")
    real, _ = await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    fake_gpu = msgspec.structs.replace(real.gpus[0], product_name="NVIDIA H200")
    forged = msgspec.structs.replace(real, gpus=[fake_gpu] * 16)
    key = subjects.inventory_key(NODE)
    await bus.kv_put(subjects.INVENTORY_BUCKET, key, forged)
    restored, _ = await wait_inventory(bus, lambda i: i.digest() == real.digest())
    assert len(restored.gpus) == 8

    await bus.kv_delete(subjects.INVENTORY_BUCKET, key)
    await wait_inventory(bus, lambda i: i.digest() == real.digest())
