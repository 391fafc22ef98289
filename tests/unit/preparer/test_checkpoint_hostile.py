"""A checkpoint of any shape is a checkpoint or a quarantine with its reason, never a crash.

The attacker is whoever can write the node's checkpoint folder (or a disk that
tears a file): both formats (ours and the reference driver's, which start-up
adopts), every shape: nested 100,000 deep, larger than any checkpoint, wrong
types, not UTF-8, cut at any byte, a directory, a FIFO, a symlink, and values
swapped at random in a file whose checksum was recomputed (neither checksum is a
secret: ours is a plain SHA-256, the reference's FNV-32a). Before the fix the deep
files raised RecursionError out of start-up (a crash loop) and a FIFO hung it.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.core.kube.resource import AllocationResult
from services.core.model import nvidia
from services.preparer import checkpointfile, refcheckpoint
from services.preparer.checkpoint import (
    CheckpointData,
    ClaimEntry,
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    ShareState,
    VfioState,
)
from services.preparer.checkpointstore import CheckpointStore
from tests.helpers.refcheckpoint import RefClaim, RefDevice, RefGroup, checkpoint_bytes, dumps

BOOT = "5c1a8e0e-6a4f-4d0b-9a8c-2f7c2b1d3e4f"
DEEP = 100_000
TOO_DEEP = "nested too deeply to read"


def load(path: Path) -> tuple[CheckpointStore, str]:
    """The store after start-up's load; the reason it quarantined the file ("" if not)."""

    def adopt(raw: bytes) -> CheckpointData | None:  # app._reference_adopter, no inventory
        if not refcheckpoint.looks_like_reference(raw):
            return None
        found = refcheckpoint.read(raw, str(path))
        return refcheckpoint.convert(found, boot_id=BOOT, inventory=None, dynamic_mig=True).data

    store = CheckpointStore(path, BOOT, booted_at=0.0)
    report = store.load(adopt=adopt)
    if report.quarantined is not None:
        assert not path.exists() or checkpointfile.decode(path.read_bytes()).claims == {}
    return store, report.reason


def arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


DEEP_FILES = {
    "ours-data": checkpointfile.envelope(b'{"claims":{"u":{"groups":' + arrays(DEEP) + b"}}}"),
    "ours-unknown-member": b'{"version":1,"x":' + objects(DEEP) + b',"data":{}}',
    "ours-config": checkpointfile.envelope(
        b'{"claims":{"u":{"state":"PrepareCompleted","namespace":"n","name":"c","groups":'
        b'[{"kind":"GpuConfig","origin":"o","config":{"x":' + objects(DEEP) + b"}}]}}}"
    ),
    "reference-v1": b'{"checksum":1,"v1":' + arrays(DEEP) + b"}",
    "reference-v2": b'{"checksum":1,"v2":' + objects(DEEP) + b"}",
    "reference-unknown-member": b'{"checksum":1,"v9":' + arrays(DEEP) + b"}",
}


@pytest.mark.parametrize("name", DEEP_FILES)
def test_a_checkpoint_100000_deep_is_quarantined_with_its_reason(tmp_path: Path, name: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(DEEP_FILES[name])
    store, reason = load(path)
    assert TOO_DEEP in reason and str(path) in reason, reason
    assert store.claims == {}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"version":"1","checksum":3,"data":[]}', "Expected `int`, got `str`"),
        (b'{"version":1' + b"0" * 5000 + b"}", "out of range"),
        (b'\xff\xfe{"version":1}', "not a checkpoint"),
        (b'{"checksum":12,"v1":"\xff"}', "not valid JSON"),
        (b'{"checksum":12,"v2":[]}', "checksum mismatch"),
        (b"", "not a checkpoint"),
        (b"null", "not a checkpoint"),
    ],
    ids=["wrong-types", "huge-number", "utf16", "reference-not-utf8", "reference-v2-list", "empty",
         "null"],
)  # fmt: skip
def test_wrong_types_and_encodings_are_quarantined(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    store, why = load(path)
    assert reason in why, why
    assert store.claims == {}


def test_a_file_larger_than_any_checkpoint_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpointfile, "MAX_FILE_BYTES", 1 << 20)
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b'{"version":1,"checksum":"","data":{"x":"' + b"a" * (1 << 20) + b'"}}')
    _, reason = load(path)
    assert "larger than 1 MiB" in reason


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink", "dangling-symlink"])
def test_what_is_not_a_regular_file_is_set_aside(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "checkpoint.json"
    secret = tmp_path / "secret"
    secret.write_text('{"version":1}')
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # reading it once blocked start-up for ever
    else:
        path.symlink_to(secret if kind == "symlink" else tmp_path / "gone")
    store, reason = load(path)
    assert reason.startswith(str(path)), reason
    assert store.claims == {} and path.is_file() and not path.is_symlink()
    assert secret.read_text() == '{"version":1}'


def reference_file() -> bytes:
    mig = {"parentMinor": 0, "giId": 1, "ciId": 0, "migUUID": "MIG-1", "parentUUID": "GPU-0"}
    migname = nvidia.mig_device_name(0, "1g.10gb", 19, 0)
    claims = [
        RefClaim("u1", [RefGroup([RefDevice("gpu", "gpu-0", "r", "n1", uuid="GPU-0")], "d", True)],
                 name="a", namespace="b", allocated=[("r", "n1", "gpu-0")]),
        RefClaim("u2", [RefGroup([RefDevice("mig", migname, "r", "n1", mig=mig, pci_bus_id="0")])]),
        RefClaim("u3", [RefGroup([RefDevice("vfio", "gpu-vfio-1", "r", "n1", pci_bus_id="0:2")])],
                 state="PrepareStarted", allocated=[("r", "n1", "gpu-vfio-1")]),
    ]  # fmt: skip
    return checkpoint_bytes(claims, BOOT)


@pytest.mark.parametrize("which", ["ours", "reference"])
def test_a_file_cut_at_any_byte_is_quarantined(tmp_path: Path, which: str) -> None:
    good = reference_file() if which == "reference" else ours_file()
    path = tmp_path / "checkpoint.json"
    for end in range(0, len(good.rstrip()), 7):
        path.write_bytes(good[:end])
        _, reason = load(path)
        assert reason, f"cut at {end} of {len(good)}: read as a checkpoint"


# ------------------------------------------------------------------ values swapped at random

_SWAPS: list[Any] = [None, 0, -1, 2**70, 1.5, "", "../../etc/passwd", True, [], {}, [1], {"a": 1},
                     ["x"], "DEEP:900", "DEEP:5000"]  # fmt: skip


def ours_file() -> bytes:
    """Our file with a claim of each kind: a GPU with MPS, a MIG device, a VFIO GPU, a share."""
    mps = MpsState(
        daemon_id="u1-0",
        root_dir="/r",
        pipe_dir="/p",
        shm_dir="/s",
        log_dir="/l",
        device_uuids=["GPU-0"],
        pinned_memory_limits_mib={"GPU-0": 1024},
    )
    mig = MigState(
        uuid="MIG-1",
        parent_uuid="GPU-0",
        parent_minor=0,
        profile="1g.10gb",
        gi_profile_id=19,
        placement_start=0,
        gi_id=1,
        ci_id=0,
        created=True,
    )
    share = ShareState(
        share_id="s", device_uuid="GPU-1", consumed={"memory": "10Gi"}, daemon_id="GPU-1"
    )
    allocation = msgspec.convert(
        {
            "devices": {
                "results": [
                    {"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}
                ]
            }
        },
        AllocationResult,
    )
    devices = [
        PreparedDeviceState(name="gpu-0", kind="gpu", requests=["r"], pool="n1", gpu_uuid="GPU-0"),
        PreparedDeviceState(name="m", kind="mig", requests=["r"], pool="n1", mig=mig),
        PreparedDeviceState(
            name="gpu-vfio-2",
            kind="vfio",
            requests=["r"],
            pool="n1",
            vfio=VfioState(pci_bus_id="0:2", iommu_group=7),
        ),
        PreparedDeviceState(name="gpu-1", kind="gpu", requests=["r"], pool="n1", share=share),
    ]
    claims = {
        "u1": ClaimEntry(state="PrepareCompleted", namespace="a", name="b", allocation=allocation,
                         devices=devices, groups=[GroupState(kind="GpuConfig", origin="class",
                                                             config={"sharing": {}}, mps=mps)]),
        "u2": ClaimEntry(state="PrepareStarted", namespace="a", name="c", allocation=allocation),
    }  # fmt: skip
    return checkpointfile.encode(CheckpointData(node_boot_id=BOOT, claims=claims))


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at]
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else []
    )
    for key, inner in items:
        found += _paths(inner, (*at, key))
    return found


def _mutated(doc: Any, rng: random.Random) -> Any:
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 3)):
        spots = [p for p in _paths(doc) if p and "checksum" not in p]
        *parent, last = rng.choice(spots)
        holder = doc
        for key in parent:
            holder = holder[key]
        holder[last] = rng.choice(_SWAPS)
    return doc


def _text(value: Any) -> str:
    """Go's JSON of ``value``, with each "DEEP:n" swapped for a list n deep."""
    deep = re.compile(r'"DEEP:(\d+)"')
    return deep.sub(lambda m: arrays(int(m[1])).decode(), dumps(value))


def _signed_reference(doc: dict[str, Any]) -> bytes:
    """A reference file with both checksums recomputed, as an attacker would."""
    v1 = _text(doc.get("v1", {}))
    top = refcheckpoint.kubelet_checksum(('{"checksum":0,"v1":' + v1 + "}").encode())
    v2 = ""
    if isinstance(doc.get("v2"), dict):
        body = {**doc["v2"], "checksum": 0}
        body["checksum"] = refcheckpoint.kubelet_checksum(_text(body).encode())
        v2 = ',"v2":' + _text(body)
    return ('{"checksum":' + str(top) + ',"v1":' + v1 + v2 + "}").encode()


def _signed_ours(doc: dict[str, Any]) -> bytes:
    return checkpointfile.envelope(_text(doc["data"]).encode())


@pytest.mark.parametrize("which", ["ours", "reference"])
def test_values_swapped_at_random_under_a_valid_checksum_never_crash_start_up(
    tmp_path: Path, which: str
) -> None:
    rng = random.Random(22)
    good = json.loads(reference_file() if which == "reference" else ours_file())
    sign = _signed_reference if which == "reference" else _signed_ours
    path = tmp_path / "checkpoint.json"
    outcomes = {"read": 0, "quarantined": 0}
    for _ in range(300):
        path.write_bytes(sign(_mutated(good, rng)))
        store, reason = load(path)  # anything but a checkpoint or a reason raises here
        outcomes["quarantined" if reason else "read"] += 1
        if not reason:
            assert checkpointfile.decode(path.read_bytes()).claims == store.claims
    assert min(outcomes.values()) > 0, outcomes  # both ways were tried
