"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


class DirSyncer:
    """Directory fsyncs after renames and unlinks, batched in one background thread.

    The file's own fsync before the rename is what keeps a reader (after any
    crash) from seeing half a file; the rename is visible to every process at
    once. The directory fsync only makes the rename itself survive a power
    loss, after which the node has a new boot id: the checkpoint is void and
    every claim spec is removed as an orphan. So nobody waits for it: the
    renames of a burst share one fsync per directory, ``linger`` seconds later.
    """

    def __init__(self, linger: float = 0.05) -> None:
        self.linger = linger
        self._dirs: set[Path] = set()
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def mark(self, directory: Path) -> None:
        """Fsync ``directory`` soon (callable from any thread)."""
        with self._wake:
            self._dirs.add(directory)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="dirsync", daemon=True)
                self._thread.start()
            self._wake.notify()
        if self._closed:
            self.flush()

    def flush(self) -> None:
        """Fsync every marked directory now."""
        with self._wake:
            dirs, self._dirs = self._dirs, set()
        for directory in dirs:
            try:
                fsync_dir(directory)
            except OSError as exc:  # gone (a test's temp root), or the disk failed
                log.warning("directory fsync failed: %s", exc, extra={"dir": str(directory)})

    def close(self) -> None:
        """Flush and stop the thread (at shut-down)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirs and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            time.sleep(self.linger)
            self.flush()


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    fsync: bool = True,
    dirs: DirSyncer | None = None,
) -> None:
    """Write ``data`` to ``path`` via a temp file, fsync, rename and directory fsync.

    With ``dirs``, the directory fsync is left to that batcher.
    """
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
        _sync_dir(path.parent, dirs)


def _sync_dir(directory: Path, dirs: DirSyncer | None) -> None:
    if dirs is None:
        fsync_dir(directory)
    else:
        dirs.mark(directory)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Path, *, fsync: bool = True, dirs: DirSyncer | None = None) -> bool:
    """Delete ``path`` durably (``dirs``: the directory fsync batched); False when absent."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if fsync:
        _sync_dir(path.parent, dirs)
    return True
