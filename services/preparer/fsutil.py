"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync, rename and directory fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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


def remove(path: Path, *, fsync: bool = True) -> bool:
    """Delete ``path`` durably; False when it was not there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if fsync:
        fsync_dir(path.parent)
    return True
