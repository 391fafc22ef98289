"""Where the kubelet expects our two unix sockets, and how they are created safely.

The kubelet finds plugins by watching ``<root>/plugins_registry`` for sockets
and talks DRA on the endpoint the registration socket names. With a rolling
update two plugin pods serve the same node at once, so each socket name
carries the pod UID (the reference's ``kubeletplugin.RollingUpdate``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

SOCKET_MODE = 0o600
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
DIR_MODE = 0o700
# A pod UID is a UUID; anything outside this set could escape the directory.
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class SocketError(RuntimeError):
    """A socket path that cannot be used (bad name, or something else lives there)."""


@dataclass(frozen=True)
class SocketPaths:
    dra: Path  # <root>/plugins/<driver>/dra[-<uid>].sock
    registration: Path  # <root>/plugins_registry/<driver>[-<uid>]-reg.sock

    @classmethod
    def for_driver(
        cls, kubelet_root: Path, driver: str, rolling_update_uid: str = ""
    ) -> SocketPaths:
        if rolling_update_uid and not _UID.fullmatch(rolling_update_uid):
            raise SocketError(
                f"--rolling-update-uid {rolling_update_uid!r}: expected a pod UID "
                "(letters, digits, '-' and '_', at most 63 characters)"
            )
        suffix = f"-{rolling_update_uid}" if rolling_update_uid else ""
        root = kubelet_root.absolute()
        paths = cls(
            dra=root / "plugins" / driver / f"dra{suffix}.sock",
            registration=root / "plugins_registry" / f"{driver}{suffix}-reg.sock",
        )
        for path in paths.all():
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                raise SocketError(
                    f"{path}: longer than the {MAX_SOCKET_PATH} bytes a unix socket path "
                    "may have; use a shorter --kubelet-root"
                )
        return paths

    def all(self) -> tuple[Path, Path]:
        return (self.dra, self.registration)


def ensure_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) mode 0700; existing directories are left alone.

    The kubelet owns ``plugins`` and ``plugins_registry``; only what we create is ours.
    """
    missing: list[Path] = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=DIR_MODE)
        os.chmod(p, DIR_MODE)  # mkdir's mode is filtered by the umask
    if not path.is_dir():
        raise SocketError(f"{path}: exists and is not a directory")


def remove_stale(path: Path) -> bool:
    """Remove a socket left behind by an earlier run; refuse to delete anything else."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketError(f"{path}: exists and is not a unix socket; refusing to replace it")
    path.unlink(missing_ok=True)
    return True


def bind(server: grpc.aio.Server, path: Path) -> None:
    """Bind ``server`` to the unix socket ``path`` with mode 0600 (grpc creates it here)."""
    with _private_umask():
        server.add_insecure_port(f"unix:{path}")
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise SocketError(f"{path}: expected the socket we just bound")
    os.chmod(path, SOCKET_MODE)  # whatever the umask did


@contextlib.contextmanager
def _private_umask() -> Iterator[None]:
    """Sockets are created with mode 0600 from the start (no window with wider access)."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)
