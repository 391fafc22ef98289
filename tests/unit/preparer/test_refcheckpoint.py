"""The reference driver's checkpoint: its checksum, its versions, and gpudra's model of it."""

from __future__ import annotations

import re

import pytest

from services.core.model import nvidia
from services.offline.slices import fleet_inventory
from services.preparer import refcheckpoint
from services.preparer.checkpointfile import CheckpointError
from tests.helpers.refcheckpoint import RefClaim, RefDevice, RefGroup, checkpoint_bytes

UIDS = [f"11111111-0000-0000-0000-00000000000{i}" for i in range(1, 5)]


def fixture_claims() -> list[RefClaim]:
    """The claims of the file checked with the Go program (see tests/helpers/refcheckpoint.py)."""
    gpu = RefDevice("gpu", "gpu-0", "gpu", "n1", uuid="GPU-aaaaaaaa-1111-2222-3333-444444444444")
    mig = RefDevice(
        "mig",
        "gpu-4-mig-3g20gb-9-0",
        "slice",
        "n1",
        pci_bus_id="0000:90:00.0",
        mig={
            "parentMinor": 4,
            "giId": 2,
            "ciId": 0,
            "migUUID": "MIG-bbbb",
            "parentUUID": "GPU-cccc",
        },
    )
    vfio = RefDevice(
        "vfio",
        "gpu-vfio-1",
        "vm",
        "n1",
        uuid="d1c0e4a2-0000-5000-8000-000000000000",
        pci_bus_id="0000:1a:00.0",
    )
    return [
        RefClaim(
            UIDS[0],
            [RefGroup([gpu], time_slice_applied=True)],
            name="a",
            namespace="default",
            allocated=[("gpu", "n1", "gpu-0")],
        ),
        RefClaim(
            UIDS[1],
            [RefGroup([mig], mps_daemon_id="x-abcde")],
            name="b<&>",
            namespace="ns",
            allocated=[("slice", "n1", "gpu-4-mig-3g20gb-9-0")],
        ),
        RefClaim(UIDS[2], [RefGroup([vfio])]),
        RefClaim(
            UIDS[3],
            [],
            state="PrepareStarted",
            name="d",
            namespace="default",
            allocated=[("gpu", "n1", "gpu-2")],
        ),
    ]


def test_the_checksum_is_the_kubelet_checkpointmanager_s() -> None:
    """Numbers computed by k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum (Go)."""
    assert refcheckpoint.kubelet_checksum(b'{"checksum":0,"v1":{}}') == 1083090442
    assert refcheckpoint.kubelet_checksum(b"abc") == 824562695


def test_files_built_for_tests_carry_the_checksums_the_reference_computes() -> None:
    """The reference's own type verified these files (round trip identical, both sums ok)."""
    full = checkpoint_bytes(fixture_claims(), "boot-1")
    assert full.startswith(b'{"checksum":4177505494,"v1":{"preparedClaims":{')
    assert b',"v2":{"checksum":3797177687,"preparedClaims":' in full
    assert b'"name":"b\\u003c\\u0026\\u003e"' in full  # Go escapes HTML characters
    assert checkpoint_bytes(fixture_claims(), v2=False).startswith(b'{"checksum":4177505494,')
    empty = checkpoint_bytes([], "boot-1")
    assert (
        empty == b'{"checksum":1083090442,"v1":{},"v2":{"checksum":70045160,"nodeBootID":"boot-1"}}'
    )


def test_v2_is_read_with_claim_states_and_v1_alone_as_all_completed() -> None:
    found = refcheckpoint.read(checkpoint_bytes(fixture_claims(), "boot-1"), "cp")
    assert (found.version, found.node_boot_id) == ("v2", "boot-1")
    states = {uid: c.checkpoint_state for uid, c in found.claims.items()}
    assert states == {
        UIDS[0]: "PrepareCompleted",
        UIDS[1]: "PrepareCompleted",
        UIDS[2]: "PrepareCompleted",
        UIDS[3]: "PrepareStarted",
    }
    assert found.claims[UIDS[1]].name == "b<&>"
    old = refcheckpoint.read(checkpoint_bytes(fixture_claims(), v2=False), "cp")
    assert old.version == "v1" and sorted(old.claims) == UIDS[:3]  # v1 never had started ones
    assert refcheckpoint.looks_like_reference(checkpoint_bytes([], ""))
    assert not refcheckpoint.looks_like_reference(b'{"version":1,"checksum":"sha256:00"}')


def _flip(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw
    return raw.replace(old, new, 1)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: raw[: len(raw) // 2], "is not valid JSON (truncated?)"),
        (lambda raw: raw[:-1], "is not valid JSON (truncated?)"),
        (lambda raw: _flip(raw, b'"gpu-0"', b'"gpu-1"'), "v1 checksum mismatch"),
        (
            lambda raw: _flip(raw, b'"PrepareStarted"', b'"PrepareCompleted"'),
            "v2 checksum mismatch",
        ),
        (lambda raw: b'{"checksum":1,"v3":{}}', "neither v1 nor v2 but v3: written by a newer"),
        (lambda raw: b'{"checksum":"x","v1":{}}', "no numeric checksum"),
        (lambda raw: raw + b"{}", "data after the object"),
    ],
)
def test_anything_that_cannot_be_trusted_is_refused_with_the_reason(edit, message: str) -> None:
    raw = edit(checkpoint_bytes(fixture_claims(), "boot-1"))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        refcheckpoint.read(raw, "cp")


def test_a_newer_file_that_still_carries_v1_is_read_from_it_as_the_reference_would() -> None:
    raw = checkpoint_bytes(fixture_claims(), v2=False)
    newer = raw[:-1] + b',"v3":{"whatever":true}}'
    assert sorted(refcheckpoint.read(newer, "cp").claims) == UIDS[:3]


def test_conversion_keeps_devices_cdi_ids_and_what_unprepare_must_undo() -> None:
    inv = fleet_inventory("dgx-a100", "n1")
    gpu0, gpu4 = inv.gpus[0], inv.gpus[4]
    mig = gpu4.mig_devices[0]
    name = nvidia.mig_device_name(4, mig.profile, mig.gi_profile_id, mig.placement.start)
    claims = [
        RefClaim(
            UIDS[0],
            [RefGroup([RefDevice("gpu", "gpu-0", "gpu", "n1", uuid=gpu0.uuid)])],
            name="a",
            namespace="default",
        ),
        RefClaim(
            UIDS[1],
            [
                RefGroup(
                    [
                        RefDevice(
                            "mig",
                            name,
                            "slice",
                            "n1",
                            mig={
                                "parentMinor": 4,
                                "giId": mig.gi_id,
                                "ciId": mig.ci_id,
                                "migUUID": mig.uuid,
                                "parentUUID": gpu4.uuid,
                            },
                        )
                    ],
                    mps_daemon_id=f"{UIDS[1]}-abcde",
                    time_slice_applied=False,
                )
            ],
        ),
        RefClaim(
            UIDS[2],
            [RefGroup([RefDevice("vfio", "gpu-vfio-1", "vm", "n1", uuid="x")])],  # no pciBusID
        ),
        RefClaim(UIDS[3], [], state="PrepareStarted", allocated=[("gpu", "n1", "gpu-2")]),
    ]
    found = refcheckpoint.read(checkpoint_bytes(claims, "boot-1"), "cp")
    out = refcheckpoint.convert(found, boot_id="boot-1", inventory=inv, dynamic_mig=True)
    entries = out.data.claims
    assert out.data.node_boot_id == "boot-1"
    assert out.mps_deployments == [f"mps-control-daemon-{UIDS[1]}-abcde"]

    a = entries[UIDS[0]]
    assert (a.state, a.namespace, a.name) == ("PrepareCompleted", "default", "a")
    [d] = a.devices
    assert (d.name, d.kind, d.requests, d.pool) == ("gpu-0", "gpu", ["gpu"], "n1")
    assert d.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={UIDS[0]}-gpu-0"]
    assert (d.gpu_uuid, d.gpu_minor, d.pci_bus_id) == (gpu0.uuid, 0, gpu0.pci_bus_id)
    assert a.groups[0].time_slice_gpus == [gpu0.uuid]  # timeSliceApplied unset: reset it

    b = entries[UIDS[1]]
    [m] = b.devices
    assert m.mig is not None
    assert (m.mig.uuid, m.mig.parent_uuid, m.mig.gi_id, m.mig.ci_id) == (
        mig.uuid,
        gpu4.uuid,
        mig.gi_id,
        mig.ci_id,
    )
    assert (m.mig.profile, m.mig.gi_profile_id, m.mig.placement_start) == (
        mig.profile,
        mig.gi_profile_id,
        mig.placement.start,
    )
    assert m.mig.created  # DynamicMIG: the reference would destroy it on unprepare
    assert b.groups[0].mps is None and b.groups[0].time_slice_gpus == []

    [v] = entries[UIDS[2]].devices
    twin = nvidia.vfio_order(inv.gpus)[1]
    assert v.vfio is not None and twin.vfio is not None
    assert (v.vfio.pci_bus_id, v.vfio.iommu_group) == (twin.pci_bus_id, twin.vfio.iommu_group)

    started = entries[UIDS[3]]
    assert started.state == "PrepareStarted" and started.devices == []
    assert started.allocation is not None and started.allocation.devices is not None
    assert [r.device for r in started.allocation.devices.results or []] == ["gpu-2"]

    static = refcheckpoint.convert(found, boot_id="boot-1", inventory=inv, dynamic_mig=False)
    assert not static.data.claims[UIDS[1]].devices[0].mig.created  # type: ignore[union-attr]
    rebooted = refcheckpoint.convert(found, boot_id="boot-2", inventory=inv, dynamic_mig=False)
    assert rebooted.data.claims == {} and rebooted.data.node_boot_id == "boot-2"
