"""A ControlPlane removes the work directory it made, and only that one.

It used to compare the directory with None after filling it in, so cleanup()
never removed the one it made: each e2e session left its etcd, logs and PKI
behind (497 directories, 32 GB on the development machine)."""

from __future__ import annotations

from pathlib import Path

from services.local.cluster import ControlPlane


def test_cleanup_removes_the_work_directory_it_made() -> None:
    cp = ControlPlane(Path("/nonexistent/controlplane"))
    made = cp.workdir
    assert made.is_dir()
    cp.cleanup()
    assert not made.exists()


def test_cleanup_keeps_a_work_directory_it_was_given(tmp_path: Path) -> None:
    given = tmp_path / "cp"
    given.mkdir()
    ControlPlane(Path("/nonexistent/controlplane"), workdir=given).cleanup()
    assert given.is_dir()


def test_leaving_a_with_block_removes_it_too() -> None:
    """``with ControlPlane(...) as cp:`` (17 test modules, two benches) ends in __exit__."""
    cp = ControlPlane(Path("/nonexistent/controlplane"))
    made = cp.workdir
    cp.__exit__(None, None, None)
    assert not made.exists()
