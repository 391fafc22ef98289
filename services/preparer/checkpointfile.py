"""The checkpoint file's format: one JSON file per node and driver
(``<kubelet-root>/plugins/<driver>/checkpoint.json``)::

    {"version": 1, "checksum": "sha256:<hex>", "data": {...}}

* The checksum covers the ``data`` bytes exactly as stored, never a re-encoding,
  so adding a field to the schema can never invalidate an older file (the
  reference driver's checkpoints broke on upgrade for that reason).
* Every version this code ever wrote has a reader that converts it to the
  current layout (``_READERS``); fields added later have defaults.
* Each claim's entry is encoded on its own (:func:`encode_entry`), and the file's
  bytes are joined from those encodings (:func:`encode_body`): a file changes only
  where a claim did.
* Whatever the file holds, reading it ends in a checkpoint or a
  :class:`CheckpointError` that says why not (which start-up quarantines): JSON
  nested deeper than the decoder goes (msgspec raises RecursionError past about
  1,000 levels, in skipped members too) is such a reason, never a crash loop.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import msgspec

from services.core.kit.limits import too_deep
from services.core.kube.resource import AllocationResult
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    CheckpointData,
    ClaimEntry,
    PreparedDeviceState,
    Record,
)

VERSION = 1
FILENAME = "checkpoint.json"
# A claim holding eight GPUs takes about 3 KB of checkpoint: 64 MiB is some 20,000
# such claims, far beyond any node. A larger file is not one we wrote, and is not
# read into memory to find that out.
MAX_FILE_BYTES = 64 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted (corrupt, or from a newer preparer)."""


class _Envelope(msgspec.Struct, kw_only=True):
    version: int = 0
    checksum: str = ""
    data: msgspec.Raw = msgspec.Raw(b"{}")


# ------------------------------------------------------------------ older versions


class _V0Device(Record, frozen=True, kw_only=True):
    name: str
    kind: Literal["gpu", "mig", "vfio"]
    requests: list[str] = []
    pool: str = ""
    cdi_device_ids: list[str] = []
    uuid: str = ""


class _V0Claim(Record, frozen=True, kw_only=True):
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


def encode_entry(entry: ClaimEntry) -> bytes:
    """One claim's entry as it is joined into the file (see :func:`encode_body`)."""
    return _ENC.encode(entry)


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
    except RecursionError as exc:
        raise CheckpointError(str(too_deep(f"{source}: not a checkpoint"))) from exc
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
    except RecursionError as exc:
        raise CheckpointError(str(too_deep(f"{source}: version {envelope.version} data"))) from exc


def read_file(path: Path) -> bytes:
    """The file's bytes; CheckpointError when it cannot be a checkpoint we wrote.

    Only a regular file is read (a FIFO would block start-up, a symlink points
    at someone else's file, and our writes never leave either), and at most
    :data:`MAX_FILE_BYTES` of it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise CheckpointError(f"{path}: a symbolic link, not a file this preparer wrote") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError(f"{path}: not a regular file (mode {stat.filemode(mode)})")
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise CheckpointError(
            f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, more than any checkpoint "
            "this preparer writes"
        )
    return raw


def default_path(kubelet_root: Path, driver: str) -> Path:
    return kubelet_root / "plugins" / driver / FILENAME
