"""The node's checkpoint: which claims are prepared, and exactly what was done for them.

One JSON file per node (``<kubelet-root>/plugins/gpu.nvidia.com/checkpoint.json``)::

    {"version": 1, "checksum": "sha256:<hex>", "data": {...}}

* The checksum covers the ``data`` bytes exactly as stored, never a re-encoding,
  so adding a field to the schema can never invalidate an older file (the
  reference driver's checkpoints broke on upgrade for that reason).
* Every version this code ever wrote has a reader that converts it to the
  current layout (``_READERS``); fields added later have defaults.
* A checkpoint from another boot (``/proc/sys/kernel/random/boot_id``) is void:
  nothing prepared before a reboot still exists.
* Writes are atomic (temp file, rename) and not fsynced: the file must survive
  the preparer being killed, which the rename guarantees, and is void after a
  power loss (a new boot id). A file torn by a power loss (written, not synced)
  is void too: one last modified before this boot is never "untrusted", whatever
  it holds. The argument is in docs/operations.md, "Durability".
* At most one write per update, on the event loop: updates made in the same
  loop turn share a write (group commit). A write is a new file swapped in
  (fsutil), tens of microseconds; a hand-off to a worker thread cost more than
  that (see docs/operations.md, "Durability"). Each claim's entry is encoded
  once, when it changes; a write joins the cached encodings.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from services.core.kube.resource import AllocationResult
from services.core.model.schemas import Gpu, MigDevice
from services.preparer.fsutil import atomic_write

log = logging.getLogger(__name__)

VERSION = 1
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
PROC_STAT = Path("/proc/stat")
FILENAME = "checkpoint.json"

# What start-up does with a checkpoint it cannot trust (corrupt, truncated, from a
# newer version): ``quarantine`` renames it to checkpoint.json.bad-<UTC time>, logs
# an error and rebuilds the state from what is on the node; ``refuse`` exits.
Recovery = Literal["quarantine", "refuse"]
RECOVERY_MODES: tuple[Recovery, ...] = ("quarantine", "refuse")
DEFAULT_RECOVERY: Recovery = "quarantine"

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: ClaimState = "PrepareStarted"
PREPARE_COMPLETED: ClaimState = "PrepareCompleted"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted (corrupt, or from a newer preparer)."""


class _Rec(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, frozen=True):
    pass


class MigState(_Rec, frozen=True, kw_only=True):
    """A MIG device as it exists: enough to find it again and to destroy it."""

    uuid: str
    parent_uuid: str
    parent_minor: int
    profile: str
    gi_profile_id: int
    placement_start: int
    placement_size: int = 0
    gi_id: int
    ci_id: int
    created: bool = False  # dynamic MIG: we created it and must destroy it

    @classmethod
    def of(cls, gpu: Gpu, device: MigDevice, *, created: bool = False) -> MigState:
        """The state of ``device``, a MIG device of ``gpu`` as the inventory lists it."""
        return cls(
            uuid=device.uuid,
            parent_uuid=gpu.uuid,
            parent_minor=gpu.minor,
            profile=device.profile,
            gi_profile_id=device.gi_profile_id,
            placement_start=device.placement.start,
            placement_size=device.placement.size,
            gi_id=device.gi_id,
            ci_id=device.ci_id,
            created=created,
        )


class VfioState(_Rec, frozen=True, kw_only=True):
    pci_bus_id: str
    iommu_group: int
    previous_driver: str = "nvidia"
    iommufd_dev: str = ""  # vfioN under /dev/vfio/devices (its IOMMUFD cdev), once bound


class ShareState(_Rec, frozen=True, kw_only=True):
    """One consumable share of a device (KEP-5075) and the limits it was given.

    The device's MPS daemon is shared by every share on it: how many prepared
    claims hold a share naming ``daemon_id`` is its reference count (read from
    the checkpoint, so it survives a preparer restart).
    """

    share_id: str
    device_uuid: str  # the GPU's, or the MIG device's: what the limits name
    consumed: dict[str, str]  # capacity -> quantity, as checked against the device's policy
    daemon_id: str
    memory_limit_mib: int | None = None
    thread_percentage: int = 100


GpuKind = Literal["gpu", "mig", "vfio"]
GPU_KINDS: tuple[GpuKind, ...] = ("gpu", "mig", "vfio")
DeviceKind = GpuKind | Literal["channel", "daemon"]  # the last two: compute-domain.nvidia.com


class PreparedDeviceState(_Rec, frozen=True, kw_only=True):
    """One allocated device and what preparing it produced."""

    name: str
    kind: DeviceKind
    requests: list[str]
    pool: str
    cdi_device_ids: list[str] = []
    gpu_uuid: str = ""  # the physical GPU (parent of a MIG device)
    gpu_minor: int = -1
    pci_bus_id: str = ""
    admin_access: bool = False
    group: int = 0
    mig: MigState | None = None
    vfio: VfioState | None = None
    share: ShareState | None = None
    share_mps: MpsState | None = None  # the device's shared daemon, as this share found it


class MpsState(_Rec, frozen=True, kw_only=True):
    daemon_id: str
    root_dir: str
    pipe_dir: str
    shm_dir: str
    log_dir: str
    device_uuids: list[str]
    gpu_uuids: list[str] = []
    active_thread_percentage: int | None = None
    pinned_memory_limits_mib: dict[str, int] = {}
    pid: int | None = None


class GroupState(_Rec, frozen=True, kw_only=True):
    """One config group: the config that won for its devices and the sharing applied."""

    kind: str  # GpuConfig / MigDeviceConfig / VfioDeviceConfig
    origin: str
    config: dict[str, Any] = {}
    time_slice: str | None = None  # interval applied, reset to Default on unprepare
    time_slice_gpus: list[str] = []
    mps: MpsState | None = None
    vfio_api_device: bool = False
    vfio_iommufd: bool = False


class ClaimEntry(_Rec, frozen=True, kw_only=True):
    state: ClaimState
    namespace: str
    name: str
    allocation: AllocationResult | None = None
    started_at: float = 0.0
    completed_at: float | None = None
    devices: list[PreparedDeviceState] = []
    groups: list[GroupState] = []
    metadata_files: list[str] = []  # KEP-5304 files written for this claim


class CheckpointData(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    node_boot_id: str = msgspec.field(default="", name="nodeBootID")
    claims: dict[str, ClaimEntry] = {}


class _Envelope(msgspec.Struct, kw_only=True):
    version: int = 0
    checksum: str = ""
    data: msgspec.Raw = msgspec.Raw(b"{}")


# ------------------------------------------------------------------ older versions


class _V0Device(_Rec, frozen=True, kw_only=True):
    name: str
    kind: Literal["gpu", "mig", "vfio"]
    requests: list[str] = []
    pool: str = ""
    cdi_device_ids: list[str] = []
    uuid: str = ""


class _V0Claim(_Rec, frozen=True, kw_only=True):
    namespace: str = ""
    name: str = ""
    allocation: AllocationResult | None = None
    devices: list[_V0Device] = []


class _V0Data(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    prepared_claims: dict[str, _V0Claim] = {}


def _from_v0(raw: bytes) -> CheckpointData:
    """v0: the draft layout before claim states and boot ids: every claim was complete."""
    old = msgspec.json.decode(raw, type=_V0Data)
    claims = {
        uid: ClaimEntry(
            state=PREPARE_COMPLETED,
            namespace=claim.namespace,
            name=claim.name,
            allocation=claim.allocation,
            devices=[
                PreparedDeviceState(
                    name=d.name,
                    kind=d.kind,
                    requests=d.requests,
                    pool=d.pool,
                    cdi_device_ids=d.cdi_device_ids,
                    gpu_uuid=d.uuid if d.kind != "mig" else "",
                )
                for d in claim.devices
            ],
        )
        for uid, claim in old.prepared_claims.items()
    }
    return CheckpointData(node_boot_id="", claims=claims)


def _from_v1(raw: bytes) -> CheckpointData:
    return msgspec.json.decode(raw, type=CheckpointData)


_READERS: Mapping[int, Callable[[bytes], CheckpointData]] = {0: _from_v0, 1: _from_v1}


# ------------------------------------------------------------------ file format


def checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


_ENC = msgspec.json.Encoder()


def encode(data: CheckpointData) -> bytes:
    return envelope(_ENC.encode(data))


def envelope(body: bytes) -> bytes:
    """The file around ``body``, the encoded :class:`CheckpointData`."""
    head = _ENC.encode({"version": VERSION, "checksum": checksum(body)})
    return head[:-1] + b',"data":' + body + b"}\n"


def encode_body(boot_id: str, entries: Mapping[str, bytes]) -> bytes:
    """The bytes of ``CheckpointData(boot_id, claims)`` from each claim's encoded entry
    (what msgspec writes for the whole, so a file changes only where a claim did)."""
    parts = [b'"nodeBootID":' + _ENC.encode(boot_id)] if boot_id else []
    if entries:
        claims = b",".join(_ENC.encode(uid) + b":" + raw for uid, raw in entries.items())
        parts.append(b'"claims":{' + claims + b"}")
    return b"{" + b",".join(parts) + b"}"


def decode(raw: bytes, source: str = "checkpoint") -> CheckpointData:
    """Any version we ever wrote, converted to the current layout; raises on corruption."""
    try:
        envelope = msgspec.json.decode(raw, type=_Envelope)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointError(f"{source}: not a checkpoint: {exc}") from exc
    reader = _READERS.get(envelope.version)
    if reader is None:
        raise CheckpointError(
            f"{source}: version {envelope.version} is not one this preparer reads "
            f"(known: {sorted(_READERS)})"
        )
    body = bytes(envelope.data)
    if envelope.checksum != checksum(body):
        raise CheckpointError(
            f"{source}: checksum mismatch (stored {envelope.checksum or 'none'}, "
            f"computed {checksum(body)}); refusing to guess what is prepared"
        )
    try:
        return reader(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointError(f"{source}: version {envelope.version} data: {exc}") from exc


def read_boot_id(path: Path = BOOT_ID_FILE) -> str:
    return path.read_text().strip()


def boot_time(path: Path = PROC_STAT) -> float:
    """When this boot began (unix time, /proc/stat ``btime``); 0 when unknown."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0.0


# ------------------------------------------------------------------ the store


# Reads another driver's checkpoint: its claims in our model, None when ``raw`` is not
# that format, CheckpointError when it is but cannot be trusted.
Adopt = Callable[[bytes], "CheckpointData | None"]


@dataclass
class LoadReport:
    """What start-up found in the checkpoint file, beyond the claims."""

    quarantined: Path | None = None  # an untrusted file, renamed here
    reason: str = ""  # why it was not trusted
    adopted_from: Path | None = None  # another driver's file, kept here after adoption


def set_aside(path: Path, tag: str) -> Path:
    """Rename ``path`` to ``<name>.<tag>-<UTC time>`` beside it (never over another file)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.{tag}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.{tag}-{stamp}-{n}")
    os.replace(path, target)
    return target


Mutation = Callable[[dict[str, ClaimEntry]], None]
Effect = Callable[[], None]
_Update = tuple[Mutation, "Effect | None", "asyncio.Future[None]"]


class CheckpointStore:
    """The checkpoint file and its in-memory copy; updates are on disk when they return.

    ``booted_at``: when this boot began (unix time; default from /proc/stat): a
    file that cannot be trusted but was last written before it is from an
    earlier boot, void like any other (a power loss can tear an unsynced file).
    """

    def __init__(self, path: Path, boot_id: str, *, booted_at: float | None = None) -> None:
        self.path = path
        self.boot_id = boot_id
        self.booted_at = boot_time() if booted_at is None else booted_at
        self._claims: dict[str, ClaimEntry] = {}
        self._encoded: dict[str, bytes] = {}  # uid -> its entry's JSON, as last written
        self._pending: list[_Update] = []
        self._write_due = False  # a write is scheduled for the next loop turn
        self.writes = 0

    @property
    def claims(self) -> Mapping[str, ClaimEntry]:
        """The committed state (what is on disk)."""
        return self._claims

    def load(
        self, *, adopt: Adopt | None = None, recovery: Recovery = DEFAULT_RECOVERY
    ) -> LoadReport:
        """Read the file (creating it when absent); a checkpoint from another boot is void.

        ``adopt`` reads another driver's format first (the reference's, on a node
        switching over); its file is kept beside ours. A file that cannot be
        trusted is quarantined (see :data:`Recovery`) or, with ``refuse``, raises,
        unless it was last written before this boot (then it is void, as below).
        """
        report = LoadReport()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            log.info("no checkpoint; starting empty", extra={"path": str(self.path)})
            self._replace({})
            return report
        raw = self.path.read_bytes()
        try:
            adopted = adopt(raw) if adopt is not None else None
            data = adopted if adopted is not None else decode(raw, str(self.path))
        except CheckpointError as exc:
            if self._from_an_earlier_boot():
                log.warning(
                    "checkpoint unreadable but last written before this boot; void like any "
                    "checkpoint from another boot (a power loss can tear an unsynced file)",
                    extra={"path": str(self.path), "why": str(exc)},
                )
                self._replace({})
                return report
            if recovery == "refuse":
                raise
            report.quarantined, report.reason = set_aside(self.path, "bad"), str(exc)
            log.error(
                "CHECKPOINT NOT TRUSTED: quarantined; rebuilding what is prepared from the node "
                "(see docs/operations.md, 'Checkpoint recovery')",
                extra={"moved_to": str(report.quarantined), "why": str(exc)},
            )
            data = CheckpointData(node_boot_id=self.boot_id)
        else:
            if adopted is not None:
                report.adopted_from = set_aside(self.path, "reference")
        if data.node_boot_id and data.node_boot_id != self.boot_id:
            log.warning(
                "checkpoint is from another boot; nothing in it exists any more",
                extra={"stored": data.node_boot_id, "current": self.boot_id},
            )
            data = CheckpointData(node_boot_id=self.boot_id)
        # Rewrite in the current version (and stamp the boot id of a v0 file).
        self._replace(dict(data.claims))
        return report

    def _from_an_earlier_boot(self) -> bool:
        try:
            return self.booted_at > 0 and self.path.stat().st_mtime < self.booted_at
        except OSError:
            return False

    def _replace(self, claims: dict[str, ClaimEntry]) -> None:
        encoded = {uid: _ENC.encode(e) for uid, e in claims.items()}
        self._write(encoded)
        self._claims, self._encoded = claims, encoded

    async def update(self, mutate: Mutation, before: Effect | None = None) -> None:
        """Apply ``mutate`` to the claims and write the file; concurrent callers share a write.

        ``before`` runs first: the file changes the new entry vouches for (a
        claim's CDI spec written, or deleted). If it raises, this update fails
        and ``mutate`` is not applied. The updates of one loop turn share a write.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((mutate, before, future))
        if not self._write_due:
            self._write_due = True
            loop.call_soon(self._write_pending)
        await future

    def _write_pending(self) -> None:
        self._write_due = False
        batch, self._pending = self._pending, []
        try:
            claims, encoded, failures = self._commit(batch)
        except Exception as exc:  # every waiter learns the write failed
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self._claims, self._encoded = claims, encoded
        for (_, _, future), failure in zip(batch, failures, strict=True):
            if future.done():
                continue
            if failure is None:
                future.set_result(None)
            else:
                future.set_exception(failure)

    def _commit(
        self, batch: list[_Update]
    ) -> tuple[dict[str, ClaimEntry], dict[str, bytes], list[Exception | None]]:
        """Each update's ``before``, the mutations of those that succeeded, one write;
        entries encoded only when they changed."""
        claims = dict(self._claims)
        failures: list[Exception | None] = []
        for mutate, before, _ in batch:
            try:
                if before is not None:
                    before()
            except Exception as exc:
                failures.append(exc)
                continue
            mutate(claims)
            failures.append(None)
        if all(f is not None for f in failures):
            return self._claims, self._encoded, failures
        encoded: dict[str, bytes] = {}
        for uid, entry in claims.items():
            raw = self._encoded.get(uid)
            encoded[uid] = (
                raw if raw is not None and self._claims.get(uid) is entry else _ENC.encode(entry)
            )
        self._write(encoded)
        return claims, encoded, failures

    async def put(self, uid: str, entry: ClaimEntry, before: Effect | None = None) -> None:
        await self.update(lambda claims: claims.__setitem__(uid, entry), before)

    async def remove(self, uid: str, before: Effect | None = None) -> None:
        """Drop ``uid``'s entry (no write when it has none)."""
        if uid not in self._claims and not self._pending:
            if before is not None:
                before()
            return

        def drop(claims: dict[str, ClaimEntry]) -> None:
            claims.pop(uid, None)

        await self.update(drop, before)

    def _write(self, encoded: Mapping[str, bytes]) -> None:
        atomic_write(self.path, envelope(encode_body(self.boot_id, encoded)), mode=0o600)
        self.writes += 1


def default_path(kubelet_root: Path, driver: str) -> Path:
    return kubelet_root / "plugins" / driver / FILENAME
