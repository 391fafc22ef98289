"""Crash-safe writes: atomic replacement, and directory fsyncs batched off the caller's path."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from services.preparer import fsutil
from services.preparer.fsutil import DirSyncer, atomic_write, remove


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, str]]:
    """Every directory fsync, with the thread that did it."""
    calls: list[tuple[Path, str]] = []
    real = fsutil.fsync_dir

    def record(directory: Path) -> None:
        calls.append((directory, threading.current_thread().name))
        real(directory)

    monkeypatch.setattr(fsutil, "fsync_dir", record)
    return calls


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_without_a_batcher_the_directory_is_synced_by_the_writer(
    tmp_path: Path, synced: list[tuple[Path, str]]
) -> None:
    atomic_write(tmp_path / "a.json", b"1")
    assert synced == [(tmp_path, threading.current_thread().name)]
    assert remove(tmp_path / "a.json")
    assert len(synced) == 2 and not (tmp_path / "a.json").exists()


def test_a_burst_of_renames_shares_directory_fsyncs_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[Path, str]] = []
    release = threading.Event()

    def slow_disk(directory: Path) -> None:  # the first fsync hangs until the burst is done
        release.wait(10)
        synced.append((directory, threading.current_thread().name))

    monkeypatch.setattr(fsutil, "fsync_dir", slow_disk)
    dirs = DirSyncer(linger=0)
    other = tmp_path / "other"
    try:
        for i in range(20):
            atomic_write(tmp_path / "checkpoint.json", f"{i}".encode(), dirs=dirs)
        atomic_write(other / "spec.yaml", b"x", dirs=dirs)
        assert remove(other / "spec.yaml", dirs=dirs)
        # Complete (renamed, visible) while no directory fsync has finished.
        assert (tmp_path / "checkpoint.json").read_bytes() == b"19"
        assert not (other / "spec.yaml").exists()
        assert synced == []
        release.set()
        wait_for(lambda: (other, "dirsync") in synced)
        time.sleep(0.05)
        assert 1 <= synced.count((tmp_path, "dirsync")) <= 2  # 21 renames
        assert synced.count((other, "dirsync")) == 1  # a rename and an unlink
        assert len(synced) <= 3
    finally:
        release.set()
        dirs.close()


def test_close_flushes_what_is_pending_and_later_marks_sync_at_once(
    tmp_path: Path, synced: list[tuple[Path, str]]
) -> None:
    dirs = DirSyncer(linger=60)  # the background thread would wait a minute
    atomic_write(tmp_path / "a", b"1", dirs=dirs)
    dirs.close()
    assert [d for d, _ in synced] == [tmp_path]
    atomic_write(tmp_path / "b", b"2", dirs=dirs)
    assert [d for d, _ in synced] == [tmp_path, tmp_path]


def test_a_directory_that_vanished_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dirs = DirSyncer()
    dirs.mark(tmp_path / "gone")
    dirs.close()
    assert "directory fsync failed" in caplog.text
