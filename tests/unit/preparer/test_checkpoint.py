"""The checkpoint file: atomic, checksummed, boot-bound, and readable across versions."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import msgspec
import pytest

from services.preparer import checkpoint, checkpointfile, checkpointstore
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    CheckpointData,
    ClaimEntry,
    PreparedDeviceState,
)
from services.preparer.checkpointfile import CheckpointError
from services.preparer.checkpointstore import CheckpointStore

BOOT = "5c1a8e0e-6a4f-4d0b-9a8c-2f7c2b1d3e4f"
UID = "7f3c2a10-5d4e-4b8a-9c1f-0a2b3c4d5e6f"

# Written by hand in the v0 layout (before claim states and boot ids existed):
# no "version" key, claims under "preparedClaims", devices with a bare "uuid".
V0_FIXTURE = (
    '{"checksum":"sha256:9bbfd1f69c92be9a6594e65efab0207abf4d0bfe8e6c5289d623435b13539d8e",'
    '"data":{"preparedClaims":{"7f3c2a10-5d4e-4b8a-9c1f-0a2b3c4d5e6f":{"namespace":"team-a",'
    '"name":"train","allocation":{"devices":{"results":[{"request":"gpu","driver":'
    '"gpu.nvidia.com","pool":"n1","device":"gpu-3"}]}},"devices":[{"name":"gpu-3","kind":"gpu",'
    '"requests":["gpu"],"pool":"n1","cdiDeviceIds":["k8s.gpu.nvidia.com/claim='
    '7f3c2a10-5d4e-4b8a-9c1f-0a2b3c4d5e6f-gpu-3"],"uuid":"GPU-4e1c6a50-0d3b-4a77-9a64-3f2b1c0d9e88"}]}}}}'
)


def entry(state: checkpoint.ClaimState = PREPARE_COMPLETED, name: str = "c") -> ClaimEntry:
    return ClaimEntry(
        state=state,
        namespace="ns",
        name=name,
        devices=[PreparedDeviceState(name="gpu-0", kind="gpu", requests=["r"], pool="n1")],
    )


def store_at(
    tmp_path: Path, boot: str = BOOT, recovery: checkpointstore.Recovery = "quarantine"
) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "plugins" / "gpu.nvidia.com" / "checkpoint.json", boot)
    store.load(recovery=recovery)
    return store


async def test_round_trip_survives_a_restart(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    await store.put(UID, entry())
    await store.put("b", entry(PREPARE_STARTED, "other"))
    await store.remove("b")
    again = store_at(tmp_path)
    assert dict(again.claims) == {UID: entry()}
    on_disk = json.loads(store.path.read_text())
    assert on_disk["version"] == checkpointfile.VERSION
    assert on_disk["data"]["nodeBootID"] == BOOT
    assert [p.name for p in store.path.parent.iterdir()] == ["checkpoint.json"]  # no temp left
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"


async def test_a_corrupt_checkpoint_is_refused_not_guessed(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    await store.put(UID, entry())
    text = store.path.read_text().replace('"name":"c"', '"name":"x"')
    store.path.write_text(text)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        store_at(tmp_path, recovery="refuse")
    assert store.path.read_text() == text  # refused: left as it was, for a person to look at
    store.path.write_text("{not json")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        store_at(tmp_path, recovery="refuse")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "not a checkpoint"),
        (b'{"version": 1, "checksum": "sha256:00", "data": {"claims"', "not a checkpoint"),
        (b'{"version": 9, "checksum": "sha256:00", "data": {}}', "version 9 is not one"),
        (b'{"version": 1, "checksum": "sha256:00", "data": {}}', "checksum mismatch"),
    ],
)
def test_an_untrusted_checkpoint_is_quarantined_and_the_store_starts_empty(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    store = CheckpointStore(path, BOOT)
    report = store.load()  # the default recovery
    assert report.quarantined is not None and reason in report.reason
    assert report.quarantined.name.startswith("checkpoint.json.bad-")
    assert report.quarantined.read_bytes() == content  # kept as it was
    assert store.claims == {} and checkpointfile.decode(path.read_bytes()).claims == {}
    again = CheckpointStore(path, BOOT)
    path.write_bytes(content)
    second = again.load()
    assert second.quarantined != report.quarantined and second.quarantined is not None
    assert second.quarantined.exists() and report.quarantined.exists()  # never overwritten


async def test_another_boot_voids_the_checkpoint(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    await store.put(UID, entry())
    rebooted = store_at(tmp_path, boot="a-new-boot")
    assert dict(rebooted.claims) == {}
    assert checkpointfile.decode(rebooted.path.read_bytes()).node_boot_id == "a-new-boot"


def test_the_hand_written_v0_fixture_reads_as_completed_claims(tmp_path: Path) -> None:
    data = checkpointfile.decode(V0_FIXTURE.encode())
    claim = data.claims[UID]
    assert claim.state == PREPARE_COMPLETED
    assert (claim.namespace, claim.name) == ("team-a", "train")
    assert claim.allocation is not None and claim.allocation.devices is not None
    assert claim.allocation.devices.results is not None
    assert claim.allocation.devices.results[0].device == "gpu-3"
    device = claim.devices[0]
    assert device.gpu_uuid == "GPU-4e1c6a50-0d3b-4a77-9a64-3f2b1c0d9e88"
    assert device.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={UID}-gpu-3"]
    # Loading it adopts the current boot id and rewrites it as the current version.
    path = tmp_path / "checkpoint.json"
    path.write_text(V0_FIXTURE)
    store = CheckpointStore(path, BOOT)
    store.load()
    assert store.claims[UID].state == PREPARE_COMPLETED
    assert json.loads(path.read_text())["version"] == checkpointfile.VERSION


def test_fields_unknown_to_this_version_do_not_break_reading() -> None:
    """A newer preparer adds a field: this one ignores it and the checksum still holds."""
    body = (
        '{"nodeBootID":"b","claims":{"u":{"state":"PrepareCompleted","namespace":"n",'
        '"name":"c","fieldFromTheFuture":{"x":1},"devices":[{"name":"gpu-0","kind":"gpu",'
        '"requests":["r"],"pool":"p","alsoNew":true}]}}}'
    )
    raw = json.dumps({"version": 1, "checksum": checkpointfile.checksum(body.encode())})
    raw = raw[:-1] + ',"data":' + body + "}"
    data = checkpointfile.decode(raw.encode())
    assert data.claims["u"].devices[0].name == "gpu-0"


def test_a_version_from_the_future_is_refused_with_the_known_ones() -> None:
    raw = '{"version": 9, "checksum": "sha256:00", "data": {}}'
    with pytest.raises(
        CheckpointError, match=r"version 9 is not one this preparer reads \(known: \[0, 1\]\)"
    ):
        checkpointfile.decode(raw.encode())


async def test_updates_share_writes_and_removing_nothing_writes_nothing(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    before = store.writes
    await asyncio.gather(*(store.put(f"uid-{i}", entry(name=f"c{i}")) for i in range(32)))
    assert len(store.claims) == 32
    written = store.writes - before
    assert written < 32  # grouped
    await store.remove("never-there")
    assert store.writes - before == written
    assert len(store_at(tmp_path).claims) == 32


async def test_the_file_is_what_msgspec_writes_for_the_whole_state(tmp_path: Path) -> None:
    """Entries are encoded once each and joined: the bytes must be the whole's encoding."""
    store = store_at(tmp_path)
    assert store.path.read_bytes() == checkpointfile.encode(CheckpointData(node_boot_id=BOOT))
    await store.put(UID, entry())
    await store.put("b", entry(PREPARE_STARTED, "other"))
    await store.put(UID, entry(name="changed"))
    whole = CheckpointData(node_boot_id=BOOT, claims=dict(store.claims))
    assert store.path.read_bytes() == checkpointfile.encode(whole)
    assert checkpointfile.encode_body("", {}) == b"{}" == msgspec.json.encode(CheckpointData())


@pytest.mark.parametrize("content", [b"", b'{"version": 1, "checksum": "sha256:00", "da'])
def test_a_torn_checkpoint_from_before_this_boot_is_void_not_untrusted(
    tmp_path: Path, content: bytes
) -> None:
    """Unsynced writes can be torn by a power loss: that file is void, as its boot is."""
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    os.utime(path, (1000.0, 1000.0))
    store = CheckpointStore(path, BOOT, booted_at=2000.0)
    report = store.load(recovery="refuse")  # not refused
    assert report.quarantined is None and store.claims == {}
    assert checkpointfile.decode(path.read_bytes()).node_boot_id == BOOT
    # Written in this boot, the same bytes are not trusted.
    path.write_bytes(content)
    with pytest.raises(CheckpointError):
        CheckpointStore(path, BOOT, booted_at=1000.0).load(recovery="refuse")


def test_boot_time_reads_btime(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nbtime 1764000000\nprocesses 9\n")
    assert checkpointstore.boot_time(stat) == 1764000000.0
    assert checkpointstore.boot_time(tmp_path / "absent") == 0.0
    assert checkpointstore.boot_time() > 0


async def test_a_failed_write_leaves_memory_and_disk_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_at(tmp_path)
    await store.put(UID, entry())

    def disk_full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointstore, "atomic_write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        await store.put("second", entry())
    monkeypatch.undo()
    assert set(store.claims) == {UID}
    assert set(store_at(tmp_path).claims) == {UID}


async def test_the_files_an_entry_vouches_for_are_in_place_before_it_is_written(
    tmp_path: Path,
) -> None:
    store = store_at(tmp_path)
    spec = tmp_path / "spec.yaml"
    seen_on_disk: list[set[str]] = []

    def write_spec() -> None:  # the checkpoint on disk does not list the claim yet
        seen_on_disk.append(set(store_at(tmp_path).claims))
        spec.write_text("spec")

    await store.put(UID, entry(), before=write_spec)
    assert seen_on_disk == [set()] and spec.exists()
    assert set(store_at(tmp_path).claims) == {UID}

    await store.remove(UID, before=spec.unlink)
    assert not spec.exists() and dict(store_at(tmp_path).claims) == {}


async def test_a_failed_file_change_fails_only_its_own_update(tmp_path: Path) -> None:
    store = store_at(tmp_path)

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    results = await asyncio.gather(
        store.put("ok-1", entry(name="a")),
        store.put("bad", entry(name="b"), before=disk_full),
        store.put("ok-2", entry(name="c"), before=lambda: None),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], OSError)
    assert set(store.claims) == {"ok-1", "ok-2"}
    assert set(store_at(tmp_path).claims) == {"ok-1", "ok-2"}
    # Alone, the same holds.
    with pytest.raises(OSError, match="No space left"):
        await store.put("bad", entry(name="b"), before=disk_full)
    assert set(store_at(tmp_path).claims) == {"ok-1", "ok-2"}
