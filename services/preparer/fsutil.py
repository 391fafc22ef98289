"""Crash-safe file writes: a reader sees the old file or the new one, never half of one.

What a write must survive is decided in docs/operations.md ("Durability"): the
preparer's files (checkpoint, claim CDI specs, KEP-5304 metadata, MPS and
simulated-device state) must survive the preparer being killed, which the
rename alone guarantees (the page cache is the kernel's, not the process's);
none of them must survive a power loss, which changes the boot id: the
checkpoint is then void and every claim file an orphan that start-up removes.
So nothing here fsyncs unless a caller asks for a file that outlives a reboot.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` via a temp file and a rename.

    ``fsync``: also fsync the file before the rename and the directory after it,
    for a file that must survive a power loss (none of the preparer's do).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not narrow what readers (the runtime) need
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Path, *, fsync: bool = False) -> bool:
    """Delete ``path`` (``fsync``: and make that survive a power loss); False when absent."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if fsync:
        fsync_dir(path.parent)
    return True
