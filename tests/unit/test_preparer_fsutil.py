"""Crash-safe writes: atomic replacement; fsync only when a caller asks for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.preparer.fsutil import atomic_write, remove


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every fsync (of a file or a directory)."""
    calls: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


def test_a_write_replaces_the_file_whole_without_fsync(tmp_path: Path, synced: list[str]) -> None:
    target = tmp_path / "sub" / "a.json"  # the directory is made on the way
    atomic_write(target, b"1", mode=0o640)
    atomic_write(target, b"22", mode=0o640)
    assert target.read_bytes() == b"22"
    assert oct(target.stat().st_mode & 0o777) == "0o640"
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]  # no temp left
    assert remove(target) and not remove(target)
    assert synced == []


def test_fsync_when_asked_syncs_the_file_and_its_directory(
    tmp_path: Path, synced: list[str]
) -> None:
    atomic_write(tmp_path / "keep", b"x", fsync=True)
    assert len(synced) == 2 and synced[1] == str(tmp_path)
    assert remove(tmp_path / "keep", fsync=True)
    assert synced[2:] == [str(tmp_path)]


def test_a_failed_rename_leaves_no_temp_file(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x").write_text("a directory is in the way")
    with pytest.raises(OSError):
        atomic_write(tmp_path / "dir", b"1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]
