"""Crash-safe writes: atomic replacement; fsync only when a caller asks for it."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from services.core.model.refusal import ClaimRefused
from services.preparer import fsutil
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


@pytest.mark.parametrize("swap", [True, False], ids=["names-swapped", "renamed-over"])
def test_a_reader_sees_the_old_file_or_the_new_one_never_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: bool
) -> None:
    monkeypatch.setattr(fsutil, "_can_exchange", swap)
    target = tmp_path / "checkpoint.json"
    versions = [bytes([65 + i % 26]) * (100 + 4093 * (i % 5)) for i in range(300)]
    atomic_write(target, versions[0])
    done = threading.Event()
    torn: list[int] = []

    def read() -> None:
        while not done.is_set():
            data = target.read_bytes()
            if data not in versions:
                torn.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for content in versions[1:]:
            atomic_write(target, content, mode=0o600)
    finally:
        done.set()
        reader.join()
    assert torn == []
    assert fsutil._can_exchange is swap  # the swap was really used (Linux, ext4 or tmpfs)
    assert target.read_bytes() == versions[-1]
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]  # nothing left


def test_a_reader_with_the_old_file_open_reads_it_whole(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.json"
    atomic_write(target, b"old " * 3000)
    with target.open("rb") as old:
        inode = os.fstat(old.fileno()).st_ino
        atomic_write(target, b"new")
        atomic_write(target, b"newer")  # the old file is unlinked, never written again
        assert old.read() == b"old " * 3000
    assert target.stat().st_ino != inode
    assert target.read_bytes() == b"newer"


def test_a_link_in_the_files_place_is_replaced_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not ours")
    (tmp_path / "spec.json").symlink_to(elsewhere)
    atomic_write(tmp_path / "spec.json", b"ours")
    assert not (tmp_path / "spec.json").is_symlink()
    assert (tmp_path / "spec.json").read_bytes() == b"ours"
    assert elsewhere.read_bytes() == b"not ours"


def test_a_refused_write_or_removal_names_the_folder_and_the_errno(tmp_path: Path) -> None:
    """A claim's error must say which folder and why (it once said "internal error")."""
    (tmp_path / "cdi").write_text("a file where the folder should be")
    target = tmp_path / "cdi" / "spec.yaml"
    with pytest.raises(fsutil.FileError) as written:
        atomic_write(target, b"{}")
    assert str(written.value) == (
        f"cannot write spec.yaml in {tmp_path / 'cdi'}: Not a directory (ENOTDIR)"
    )
    assert isinstance(written.value, ClaimRefused)  # the claim's error, not a bug
    assert written.value.errno == errno.ENOTDIR and written.value.filename == str(target)
    (tmp_path / "d").mkdir()
    with pytest.raises(fsutil.FileError, match=rf"cannot remove d in {tmp_path}: .* \(EISDIR\)"):
        remove(tmp_path / "d")
    assert remove(tmp_path / "gone") is False


def test_a_full_folder_fails_the_write_by_name_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC mid-write: the claim's error names the folder; nothing half-written stays."""

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(fsutil.FileError) as err:
        atomic_write(tmp_path / "spec.yaml", b"{}")
    assert (
        str(err.value) == f"cannot write spec.yaml in {tmp_path}: No space left on device (ENOSPC)"
    )
    assert list(tmp_path.iterdir()) == []  # the temp file was left behind, on a full disk
