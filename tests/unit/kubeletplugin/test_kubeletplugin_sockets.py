"""Socket names, modes and stale-socket handling of the kubelet plugin front."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.kubeletplugin.sockets import (
    SocketError,
    SocketPaths,
    bind,
    ensure_dir,
    remove_stale,
)

DRIVER = "gpu.nvidia.com"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kps-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_default_names() -> None:
    paths = SocketPaths.for_driver(Path("/var/lib/kubelet"), DRIVER)
    assert paths.dra == Path("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock")
    assert paths.registration == Path("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock")


def test_rolling_update_names_carry_the_pod_uid() -> None:
    uid = "5f1c9c1e-4b1a-4c7e-9a53-0d7d2b9f3e11"
    paths = SocketPaths.for_driver(Path("/var/lib/kubelet"), DRIVER, uid)
    assert paths.dra == Path(f"/var/lib/kubelet/plugins/gpu.nvidia.com/dra-{uid}.sock")
    assert paths.registration == Path(
        f"/var/lib/kubelet/plugins_registry/gpu.nvidia.com-{uid}-reg.sock"
    )


def test_relative_root_becomes_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # tmp_path can pass 107 bytes
        monkeypatch.chdir(short)
        paths = SocketPaths.for_driver(Path("k"), DRIVER)
        assert paths.dra.is_absolute()
        assert paths.dra == Path(short) / "k/plugins/gpu.nvidia.com/dra.sock"


@pytest.mark.parametrize("uid", ["../x", "a/b", ".hidden", "a b", "x" * 64, "*"])
def test_rolling_update_uid_that_could_escape_is_refused(uid: str) -> None:
    with pytest.raises(SocketError, match="--rolling-update-uid"):
        SocketPaths.for_driver(Path("/var/lib/kubelet"), DRIVER, uid)


def test_too_long_socket_path_is_refused() -> None:
    with pytest.raises(SocketError, match="longer than the 107 bytes"):
        SocketPaths.for_driver(Path("/" + "d" * 90), DRIVER)


def test_created_directories_are_private_existing_ones_untouched(short_dir: Path) -> None:
    os.chmod(short_dir, 0o755)
    target = short_dir / "plugins" / DRIVER
    ensure_dir(target)
    assert stat.S_IMODE(short_dir.stat().st_mode) == 0o755
    for created in (short_dir / "plugins", target):
        assert stat.S_IMODE(created.stat().st_mode) == 0o700
    ensure_dir(target)  # idempotent


def test_ensure_dir_refuses_a_file(short_dir: Path) -> None:
    (short_dir / "plugins").write_text("")
    with pytest.raises(SocketError, match="not a directory"):
        ensure_dir(short_dir / "plugins")


def test_stale_socket_is_removed_other_files_are_refused(short_dir: Path) -> None:
    stale = short_dir / "dra.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    assert remove_stale(stale) is True
    assert not stale.exists()
    assert remove_stale(stale) is False  # nothing there: nothing to do

    squatter = short_dir / "reg.sock"
    squatter.write_text("data")
    with pytest.raises(SocketError, match="not a unix socket"):
        remove_stale(squatter)
    assert squatter.read_text() == "data"


async def test_bound_socket_has_mode_0600_whatever_the_umask(short_dir: Path) -> None:
    old = os.umask(0)
    try:
        server = grpc.aio.server()
        path = short_dir / "dra.sock"
        bind(server, path)
        await server.start()
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert os.umask(0) == 0  # the private umask was restored
        await server.stop(None)
    finally:
        os.umask(old)
