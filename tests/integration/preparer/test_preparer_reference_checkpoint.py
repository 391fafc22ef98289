"""A node switching from the reference driver: the real preparer over the reference's checkpoint.

The reference keeps its checkpoint where gpudra keeps its own
(``<kubelet-root>/plugins/gpu.nvidia.com/checkpoint.json``). The files here are
written in its exact JSON shape with its checksums (tests/helpers/refcheckpoint.py),
together with the claim CDI specs and host state it leaves on a node. The
preparer must keep those claims prepared and unprepare them cleanly; a
checkpoint it cannot trust is quarantined and the prepared claims rebuilt from
the node, never a crash loop (unless asked to refuse).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.core.model import gpudevices, nvidia
from services.core.model.schemas import NodeInventory
from services.local.natsserver import NatsServer
from tests.helpers.preparer import Dev, Node, make_claim, new_uid
from tests.helpers.refcheckpoint import RefClaim, RefDevice, RefGroup, cdi_spec, checkpoint_bytes

pytestmark = pytest.mark.integration

GATES = "PassthroughSupport=true,TimeSlicingSettings=true"


@pytest.fixture
async def node(short_root: Path, nats_server: NatsServer, bus: Bus) -> AsyncIterator[Node]:
    running = Node(short_root, nats_server, bus, fleet="dgx-a100")
    await running.start_discovery()
    running.boot_id_file.write_text(new_uid() + "\n")
    try:
        yield running
    finally:
        await running.close()


def boot_id(node: Node) -> str:
    return node.boot_id_file.read_text().strip()


def leave_as_the_reference_did(node: Node, checkpoint: bytes, specs: dict[str, list[str]]) -> None:
    node.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
    node.checkpoint_path.write_bytes(checkpoint)
    node.paths.cdi_root.mkdir(parents=True, exist_ok=True)
    for uid, names in specs.items():
        (node.paths.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").write_text(
            cdi_spec(uid, names)
        )


def set_aside(node: Node, tag: str) -> list[Path]:
    return sorted(node.paths.plugin_dir.glob(f"checkpoint.json.{tag}-*"))


def spec_uids(node: Node) -> set[str]:
    return {p.name.removeprefix("k8s.gpu.nvidia.com-claim_")[:-5] for p in node.cdi_files()}


async def the_inventory(node: Node) -> NodeInventory:
    inv = await node.inventory()
    assert inv is not None
    return inv


async def test_the_reference_s_claims_stay_prepared_and_unprepare_cleanly(node: Node) -> None:
    inv = await the_inventory(node)
    gpu0, gpu4 = inv.gpus[0], inv.gpus[4]
    mig = gpu4.mig_devices[0]
    mig_name = nvidia.mig_device_name(4, mig.profile, mig.gi_profile_id, mig.placement.start)
    twin = nvidia.vfio_order(inv.gpus)[1]
    uid_gpu, uid_mig, uid_vfio, uid_started = (new_uid() for _ in range(4))
    claims = {
        uid_gpu: make_claim(node.name, [Dev("gpu", "gpu-0")], uid=uid_gpu, name="train"),
        uid_mig: make_claim(node.name, [Dev("slice", mig_name)], uid=uid_mig, name="infer"),
        uid_vfio: make_claim(node.name, [Dev("vm", "gpu-vfio-1")], uid=uid_vfio, name="vm"),
    }
    for claim in claims.values():
        await node.put_claim(claim)
    reference = checkpoint_bytes(
        [
            RefClaim(
                uid_gpu,
                [
                    RefGroup(
                        [RefDevice("gpu", "gpu-0", "gpu", node.name, uuid=gpu0.uuid)],
                        time_slice_applied=True,
                    )
                ],
                name="train",
                namespace="default",
                allocated=[("gpu", node.name, "gpu-0")],
            ),
            RefClaim(
                uid_mig,
                [
                    RefGroup(
                        [
                            RefDevice(
                                "mig",
                                mig_name,
                                "slice",
                                node.name,
                                pci_bus_id=gpu4.pci_bus_id,
                                mig={
                                    "parentMinor": 4,
                                    "giId": mig.gi_id,
                                    "ciId": mig.ci_id,
                                    "migUUID": mig.uuid,
                                    "parentUUID": gpu4.uuid,
                                },
                            )
                        ],
                        mps_daemon_id=f"{uid_mig}-1a2b3",
                    )
                ],
                name="infer",
                namespace="default",
            ),
            RefClaim(
                uid_vfio,
                [
                    RefGroup(
                        [
                            RefDevice(
                                "vfio",
                                "gpu-vfio-1",
                                "vm",
                                node.name,
                                uuid=gpudevices.vfio_uuid(twin.pci_bus_id),
                                pci_bus_id=twin.pci_bus_id,
                            )
                        ]
                    )
                ],
            ),
            RefClaim(
                uid_started,
                [],
                state="PrepareStarted",
                name="half",
                namespace="default",
                allocated=[("gpu", node.name, "gpu-2")],
            ),
        ],
        boot_id(node),
    )
    leave_as_the_reference_did(
        node,
        reference,
        {uid_gpu: ["gpu-0"], uid_mig: [mig_name], uid_vfio: ["gpu-vfio-1"], uid_started: ["gpu-2"]},
    )
    host = {"time_slice": {gpu0.uuid: "Long"}, "pci_driver": {twin.pci_bus_id: "vfio-pci"}}
    (node.paths.plugin_dir / "simulated-host.json").write_text(json.dumps(host))

    preparer = await node.start_preparer(gates=GATES)

    log = preparer.output()
    assert "ADOPTING THE REFERENCE DRIVER'S CHECKPOINT" in log
    assert f"mps-control-daemon-{uid_mig}-1a2b3" in log  # named for the operator to delete
    [kept] = set_aside(node, "reference")
    assert kept.read_bytes() == reference  # the original, for a way back
    entries = node.checkpoint().claims
    assert sorted(entries) == sorted([uid_gpu, uid_mig, uid_vfio])  # the started one rolled back
    assert {e.state for e in entries.values()} == {"PrepareCompleted"}
    assert spec_uids(node) == {uid_gpu, uid_mig, uid_vfio}

    # The kubelet asking again gets what the reference answered; the devices stay held.
    reply = await node.prepare(claims[uid_gpu])
    assert reply.claims[uid_gpu].error == ""
    [device] = reply.claims[uid_gpu].devices
    assert device.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={uid_gpu}-gpu-0"]
    thief = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")], name="thief"))
    error = (await node.prepare(thief)).claims[thief.metadata.uid or ""].error
    assert "is held by claim default/train" in error, error

    reply = await node.unprepare(*claims.values())
    assert {uid: c.error for uid, c in reply.claims.items()} == dict.fromkeys(claims, "")
    assert node.cdi_files() == []
    assert dict(node.checkpoint().claims) == {}
    assert node.sim_host()["time_slice"] == {}  # reset to Default, as the reference would
    assert node.sim_host()["pci_driver"] == {}  # back to nvidia
    assert mig.uuid in await node.mig_uuids()  # static MIG: not the driver's to destroy


def _truncated(raw: bytes) -> bytes:
    return raw[: len(raw) * 2 // 3]


def _tampered(raw: bytes) -> bytes:
    return raw.replace(b'"gpu-1"', b'"gpu-3"')


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncated, "is not valid JSON (truncated?)"),
        (_tampered, "checksum mismatch"),
        (lambda raw: b'{"checksum":1,"v3":{"preparedClaims":{}}}', "written by a newer version"),
        (lambda raw: b'{"version":2,"checksum":"sha256:00","data":{}}', "version 2 is not one"),
    ],
    ids=["truncated", "tampered", "newer-reference", "newer-gpudra"],
)
async def test_an_untrusted_checkpoint_is_quarantined_and_the_node_rebuilt(
    node: Node, damage, reason: str
) -> None:
    inv = await the_inventory(node)
    uid = new_uid()
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-1")], uid=uid, name="job"))
    good = checkpoint_bytes(
        [
            RefClaim(
                uid,
                [RefGroup([RefDevice("gpu", "gpu-1", "gpu", node.name, uuid=inv.gpus[1].uuid)])],
                name="job",
                namespace="default",
                allocated=[("gpu", node.name, "gpu-1")],
            )
        ],
        boot_id(node),
    )
    bad = damage(good)
    stray = new_uid()  # a spec without a claim in the bucket: rebuilt all the same
    leave_as_the_reference_did(node, bad, {uid: ["gpu-1"], stray: ["gpu-3"]})

    preparer = await node.start_preparer(gates=GATES)  # the default: quarantine

    log = preparer.output()
    assert "CHECKPOINT NOT TRUSTED" in log and reason in log
    [quarantined] = set_aside(node, "bad")
    assert quarantined.read_bytes() == bad
    entries = node.checkpoint().claims
    assert sorted(entries) == sorted([uid, stray])
    entry = entries[uid]
    assert (entry.state, entry.namespace, entry.name) == ("PrepareCompleted", "default", "job")
    [device] = entry.devices
    assert (device.name, device.requests, device.gpu_uuid) == ("gpu-1", ["gpu"], inv.gpus[1].uuid)
    assert [d.name for d in entries[stray].devices] == ["gpu-3"]
    assert spec_uids(node) == {uid, stray}  # start-up clean-up left them in place

    reply = await node.prepare(claim)
    assert reply.claims[uid].error == ""
    assert reply.claims[uid].devices[0].cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"]
    reply = await node.unprepare(claim, make_claim(node.name, [], uid=stray))
    assert {u: c.error for u, c in reply.claims.items()} == {uid: "", stray: ""}
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}


async def test_refuse_exits_with_the_reason_and_leaves_the_file(node: Node) -> None:
    bad = _truncated(checkpoint_bytes([RefClaim(new_uid(), [])], boot_id(node)))
    leave_as_the_reference_did(node, bad, {})
    env = {"GPUDRA_CHECKPOINT_RECOVERY": "refuse"}
    preparer = await node.start_preparer(gates=GATES, env=env, ready=False)
    assert preparer.wait(timeout=30) != 0
    out = preparer.output()
    assert "the reference driver's checkpoint is not valid JSON (truncated?)" in out, out
    assert "--checkpoint-recovery=quarantine" in out
    assert node.checkpoint_path.read_bytes() == bad and set_aside(node, "bad") == []
