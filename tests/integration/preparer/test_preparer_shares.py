"""Consumable shares (KEP-5075) prepared on a simulated node: fit, one MPS daemon, limits.

The preparer runs as ``gpudra preparer`` with ``ConsumableShares`` and
``--consumable-shares memory`` beside simulated discovery on a real
nats-server. Each claim holds one share of ``gpu-0`` as the scheduler would
allocate it (a ``shareID`` and its ``consumedCapacity``). Limits are proven by
a simulated MPS client that connects with a share's CDI edits, as its
container would, and allocates memory.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.core.model import nvidia
from services.local.natsserver import NatsServer
from services.preparer import cdi
from services.preparer.devices.simclient import SimCudaError, SimMpsClient
from tests.helpers.preparer import Dev, Node, gpu_config, make_claim, opaque, validate_cdi_file

pytestmark = pytest.mark.integration

GATES = "ConsumableShares=true"
MEMORY_MODE = ["--consumable-shares", "memory"]
GIB = 1024**3


def share(memory: str, device: str = "gpu-0") -> Dev:
    return Dev("gpu", device, share=str(uuid.uuid4()), consumed={"memory": memory})


async def put_share(node: Node, memory: str, name: str, **kw: object) -> ResourceClaim:
    claim = make_claim(node.name, [share(memory)], name=name, **kw)  # type: ignore[arg-type]
    return await node.put_claim(claim)


def uid_of(claim: ResourceClaim) -> str:
    return claim.metadata.uid or ""


def share_id(claim: ResourceClaim) -> str:
    assert claim.status and claim.status.allocation and claim.status.allocation.devices
    results = claim.status.allocation.devices.results or []
    return results[0].share_id or ""


def client(node: Node, claim: ResourceClaim) -> SimMpsClient:
    [path] = [p for p in node.cdi_files() if uid_of(claim) in p.name]
    spec = validate_cdi_file(path)
    return SimMpsClient.from_cdi(
        node.paths.plugin_dir, spec, cdi.device_name(uid_of(claim), "gpu-0", share_id(claim))
    )


async def test_three_shares_of_one_h100_fit_a_fourth_does_not(node: Node) -> None:
    """20Gi + 20Gi + 39Gi of an H100's 81559Mi fit; 8Gi more does not; one daemon serves all."""
    proc = await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    inv = await node.inventory()
    assert inv is not None
    gpu0 = next(g.uuid for g in inv.gpus if g.minor == 0)
    claims = [
        await put_share(node, "20Gi", "a"),
        await put_share(node, "20Gi", "b"),
        await put_share(node, "39Gi", "c"),
    ]
    reply = await node.prepare(*claims)
    for claim in claims:
        result = reply.claims[uid_of(claim)]
        assert result.error == ""
        [device] = result.devices
        assert device.share_id == share_id(claim)
        assert device.cdi_device_ids == [
            f"k8s.gpu.nvidia.com/claim={uid_of(claim)}-gpu-0-{share_id(claim)}"
        ]
    host = node.sim_host()
    assert list(host["mps"]) == [f"shared-{gpu0}"]  # one daemon for the GPU, not per claim
    assert host["compute_mode"] == {gpu0: "EXCLUSIVE_PROCESS"}

    # Each container's MPS client gets its own limit; past it, allocations fail.
    a, c = client(node, claims[0]), client(node, claims[2])
    assert a.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu0}=20480M"
    assert a.active_thread_percentage == 26  # ceil(100 * 20Gi / 81559Mi)
    assert c.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu0}=39936M"
    a.allocate(gpu0, 19 * GIB)
    with pytest.raises(SimCudaError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        a.allocate(gpu0, 2 * GIB)
    c.allocate(gpu0, 39 * GIB)

    fourth = await put_share(node, "8Gi", "d")
    error = (await node.prepare(fourth)).claims[uid_of(fourth)].error
    assert "device 'gpu-0'" in error and "needs memory 8Gi" in error
    assert "hold 79Gi of 81559Mi" in error
    assert all(n in error for n in ("default/a", "default/b", "default/c"))
    assert uid_of(fourth) not in node.checkpoint().claims  # nothing half-done

    # The daemon's reference count is the checkpoint's: it survives a restart.
    assert (await node.unprepare(claims[0])).claims[uid_of(claims[0])].error == ""
    assert list(node.sim_host()["mps"]) == [f"shared-{gpu0}"]
    proc.stop()
    await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    assert list(node.sim_host()["mps"]) == [f"shared-{gpu0}"]
    assert (await node.prepare(fourth)).claims[uid_of(fourth)].error == ""  # fits now
    for claim in (claims[1], claims[2], fourth):
        assert (await node.unprepare(claim)).claims[uid_of(claim)].error == ""
    host = node.sim_host()
    assert host["mps"] == {} and host["compute_mode"] == {}  # stopped with the last share
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}


async def test_a_client_that_rewrites_its_environment_escapes_its_limit(node: Node) -> None:
    """What MPS limits cannot stop (docs/operations.md): they are the client's own env."""
    await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    inv = await node.inventory()
    assert inv is not None
    gpu0 = next(g.uuid for g in inv.gpus if g.minor == 0)
    claim = await put_share(node, "10Gi", "small")
    assert (await node.prepare(claim)).claims[uid_of(claim)].error == ""
    honest = client(node, claim)
    with pytest.raises(SimCudaError):
        honest.allocate(gpu0, 11 * GIB)
    rogue = client(node, claim)
    rogue.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{gpu0}=70G"
    rogue.allocate(gpu0, 60 * GIB)


async def test_bad_shares_are_refused_with_the_field_and_nothing_is_left(node: Node) -> None:
    await node.start_preparer(gates=f"{GATES},TimeSlicingSettings=true", extra=MEMORY_MODE)
    cases = {
        "larger than the GPU": (
            [share("100Gi")],
            (),
            "consumedCapacity[memory]: 100Gi is outside 0..81559Mi",
        ),
        "off the policy's step": (
            [share("1000")],
            (),
            "consumedCapacity[memory]: 1000 disagrees with the device's request policy "
            "(range 1Mi..81559Mi step 1Mi)",
        ),
        "an unknown capacity": (
            [Dev("gpu", "gpu-0", share=str(uuid.uuid4()), consumed={"cores": "1"})],
            (),
            "consumedCapacity names ['cores']",
        ),
        "mixed sharing strategies": (
            [share("10Gi")],
            [opaque(gpu_config(strategy="TimeSlicing"))],
            "sharing.strategy 'TimeSlicing' cannot be mixed with consumable shares",
        ),
        "a share of a VFIO device": (
            [Dev("gpu", "gpu-vfio-0", share=str(uuid.uuid4()), consumed={})],
            (),
            "",  # not published on this node: DeviceNotFound or ShareError, both say so
        ),
    }
    for index, (what, (devices, configs, wanted)) in enumerate(cases.items()):
        claim = await node.put_claim(
            make_claim(node.name, devices, name=f"bad-{index}", configs=configs)
        )
        error = (await node.prepare(claim)).claims[uid_of(claim)].error
        assert error, what
        assert wanted in error, (what, error)
        assert "allocation.devices.results[0]" in error or not wanted, (what, error)
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}
    assert node.sim_host().get("mps", {}) == {}


async def test_a_share_and_an_exclusive_claim_exclude_each_other(node: Node) -> None:
    await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    shared = await put_share(node, "10Gi", "shared")
    assert (await node.prepare(shared)).claims[uid_of(shared)].error == ""
    whole = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")], name="whole"))
    error = (await node.prepare(whole)).claims[uid_of(whole)].error
    assert "device 'gpu-0' is held by claim default/shared" in error
    assert (await node.unprepare(shared)).claims[uid_of(shared)].error == ""
    assert (await node.prepare(whole)).claims[uid_of(whole)].error == ""
    late = await put_share(node, "10Gi", "late")
    assert "held by claim default/whole" in (await node.prepare(late)).claims[uid_of(late)].error


async def test_a_share_on_a_node_without_consumable_shares_is_refused(node: Node) -> None:
    await node.start_preparer()
    claim = await put_share(node, "10Gi", "unshared")
    error = (await node.prepare(claim)).claims[uid_of(claim)].error
    assert "does not publish it with allowMultipleAllocations" in error
    assert "ConsumableShares" in error and "allocation.devices.results[0]" in error


async def test_the_mode_needs_its_gate(node: Node, tmp_path: Path) -> None:
    proc = await node.start_preparer(extra=MEMORY_MODE, ready=False)
    assert proc.wait() != 0
    assert "--consumable-shares requires feature gate ConsumableShares" in proc.output()


async def test_a_share_of_a_static_mig_device_names_the_mig_uuid(
    short_root: Path, nats_server: NatsServer, bus: Bus
) -> None:
    """MIG devices are shared too; the limits name the MIG device, its parent runs MPS."""
    node = Node(short_root, nats_server, bus, fleet="dgx-a100")
    await node.start_discovery()
    try:
        await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
        inv = await node.inventory()
        assert inv is not None
        gpu = next(g for g in inv.gpus if g.mig_devices)
        mig = gpu.mig_devices[0]
        start = mig.placement.start
        name = nvidia.mig_device_name(gpu.minor, mig.profile, mig.gi_profile_id, start)
        dev = Dev("mig", name, share=str(uuid.uuid4()), consumed={"memory": "1Gi"})
        claim = await node.put_claim(make_claim(node.name, [dev], name="mig-share"))
        result = (await node.prepare(claim)).claims[uid_of(claim)]
        assert result.error == ""
        [path] = node.cdi_files()
        spec = validate_cdi_file(path)
        mps = SimMpsClient.from_cdi(
            node.paths.plugin_dir, spec, cdi.device_name(uid_of(claim), name, dev.share)
        )
        assert mps.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{mig.uuid}=1024M"
        assert node.sim_host()["compute_mode"] == {gpu.uuid: "EXCLUSIVE_PROCESS"}
        assert list(node.sim_host()["mps"]) == [f"shared-{mig.uuid}"]
        assert (await node.unprepare(claim)).claims[uid_of(claim)].error == ""
        assert node.sim_host()["mps"] == {}
    finally:
        await node.close()


async def test_a_quarantined_checkpoint_rebuilds_shares_and_keeps_their_daemon(
    node: Node,
) -> None:
    """The shares come back from their CDI specs and the claims bucket; the daemon stays."""
    proc = await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    inv = await node.inventory()
    assert inv is not None
    gpu0 = next(g.uuid for g in inv.gpus if g.minor == 0)
    claims = [await put_share(node, "20Gi", "a"), await put_share(node, "30Gi", "b")]
    reply = await node.prepare(*claims)
    assert all(r.error == "" for r in reply.claims.values())
    proc.stop()
    node.checkpoint_path.write_bytes(b'{"version": 1, "checksum": "sha256:00", "da')  # torn
    proc = await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    assert "CHECKPOINT NOT TRUSTED" in proc.output()
    entries = node.checkpoint().claims
    for claim in claims:
        [device] = entries[uid_of(claim)].devices
        assert device.name == "gpu-0" and device.share is not None
        assert device.share.share_id == share_id(claim)
        assert device.share.daemon_id == f"shared-{gpu0}"
    assert list(node.sim_host()["mps"]) == [f"shared-{gpu0}"]  # kept by start-up
    # The rebuilt shares still count: 20Gi + 30Gi + 40Gi do not fit 81559Mi.
    big = await put_share(node, "40Gi", "big")
    assert "hold 50Gi of 81559Mi" in (await node.prepare(big)).claims[uid_of(big)].error
    for claim in claims:
        assert (await node.unprepare(claim)).claims[uid_of(claim)].error == ""
    assert node.sim_host()["mps"] == {} and node.cdi_files() == []


async def test_a_share_count_gives_each_share_its_part_of_the_sms(node: Node) -> None:
    """``--consumable-shares 4``: a share of 1 gets 25% of the SMs and, asking no
    memory, no pinned limit; a fifth share of the GPU does not fit."""
    await node.start_preparer(gates=GATES, extra=["--consumable-shares", "4"])
    claims = []
    for i in range(4):
        dev = Dev("gpu", "gpu-0", share=str(uuid.uuid4()), consumed={"memory": "0", "shares": "1"})
        claims.append(await node.put_claim(make_claim(node.name, [dev], name=f"quarter-{i}")))
    reply = await node.prepare(*claims)
    assert all(r.error == "" for r in reply.claims.values()), [
        r.error for r in reply.claims.values()
    ]
    mps = client(node, claims[0])
    assert mps.active_thread_percentage == 25
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in mps.env
    dev = Dev("gpu", "gpu-0", share=str(uuid.uuid4()), consumed={"memory": "0", "shares": "1"})
    fifth = await node.put_claim(make_claim(node.name, [dev], name="fifth"))
    error = (await node.prepare(fifth)).claims[uid_of(fifth)].error
    assert "needs shares 1, but the shares prepared on it hold 4 of 4" in error


async def test_shares_prepared_at_once_count_a_finished_one_once(node: Node) -> None:
    """A share's checkpoint entry is complete a moment before its prepare lets go of
    what it reserved; a share planned in that moment counted it twice and was refused
    ("hold 4 of 4", one claim listed as prepared and as being prepared). It takes the
    right moment, so: rounds of four quarters prepared at once, each must all fit."""
    await node.start_preparer(gates=GATES, extra=["--consumable-shares", "4"])
    for round_ in range(12):
        claims = []
        for i in range(4):
            dev = Dev(
                "gpu", "gpu-0", share=str(uuid.uuid4()), consumed={"memory": "0", "shares": "1"}
            )
            name = f"r{round_}-q{i}"
            claims.append(await node.put_claim(make_claim(node.name, [dev], name=name)))
        reply = await node.prepare(*claims)
        errors = [r.error for r in reply.claims.values() if r.error]
        assert errors == [], f"round {round_}: {errors}"
        reply = await node.unprepare(*claims)
        assert all(r.error == "" for r in reply.claims.values()), reply


async def test_two_shares_prepared_at_once_cannot_both_take_the_rest(node: Node) -> None:
    """Shares in flight count: of two 50Gi shares asked together, exactly one fits."""
    await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    claims = [await put_share(node, "50Gi", "left"), await put_share(node, "50Gi", "right")]
    reply = await node.prepare(*claims)
    errors = sorted(r.error for r in reply.claims.values())
    assert errors[0] == "" and "needs memory 50Gi" in errors[1], errors
    assert len(node.checkpoint().claims) == 1
    assert len(node.sim_host()["mps"]) == 1


async def test_shares_unprepared_at_once_stop_their_daemon(node: Node) -> None:
    """The kubelet unprepares pods side by side: the last share out stops the daemon even
    when every share leaves in the same moment (each saw the others still there)."""
    await node.start_preparer(gates=GATES, extra=MEMORY_MODE)
    claims = [await put_share(node, "20Gi", name) for name in ("x", "y", "z")]
    reply = await node.prepare(*claims)
    assert all(r.error == "" for r in reply.claims.values()), [
        r.error for r in reply.claims.values()
    ]
    assert len(node.sim_host()["mps"]) == 1
    reply = await node.unprepare(*claims)  # one request: its claims run concurrently
    assert all(r.error == "" for r in reply.claims.values())
    host = node.sim_host()
    assert host["mps"] == {} and host["compute_mode"] == {}
    assert dict(node.checkpoint().claims) == {}
