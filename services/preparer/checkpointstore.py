"""The node's checkpoint store: the checkpoint file and its in-memory copy.

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
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.preparer.checkpoint import CheckpointData, ClaimEntry
from services.preparer.checkpointfile import (
    CheckpointError,
    decode,
    encode_body,
    encode_entry,
    envelope,
    read_file,
)
from services.preparer.fsutil import atomic_write

log = logging.getLogger(__name__)

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
PROC_STAT = Path("/proc/stat")

# What start-up does with a checkpoint it cannot trust (corrupt, truncated, from a
# newer version): ``quarantine`` renames it to checkpoint.json.bad-<UTC time>, logs
# an error and rebuilds the state from what is on the node; ``refuse`` exits.
Recovery = Literal["quarantine", "refuse"]
RECOVERY_MODES: tuple[Recovery, ...] = ("quarantine", "refuse")
DEFAULT_RECOVERY: Recovery = "quarantine"


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
        if not os.path.lexists(self.path):
            log.info("no checkpoint; starting empty", extra={"path": str(self.path)})
            self._replace({})
            return report
        try:
            raw = read_file(self.path)
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
        """A regular file last written before this boot (anything else is set aside)."""
        try:
            st = self.path.lstat()
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and 0 < self.booted_at and st.st_mtime < self.booted_at

    def _replace(self, claims: dict[str, ClaimEntry]) -> None:
        encoded = {uid: encode_entry(e) for uid, e in claims.items()}
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
                raw if raw is not None and self._claims.get(uid) is entry else encode_entry(entry)
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
