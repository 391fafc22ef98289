"""Container images for the real nodes, built here: no registry, no docker.

Two OCI image archives (the layout ``ctr images import`` reads, written by
:mod:`services.local.oci`), each one uncompressed layer written with :mod:`tarfile`:

* ``pause`` (the pod sandbox): a static ``pause`` compiled with ``cc -static``
  from the few lines Kubernetes' own pause.c is (reap children, exit on
  SIGINT/SIGTERM);
* ``busybox`` (every workload container): Debian's ``busybox-static`` with a
  link per applet, ``/bin/bash`` a two-line stand-in that runs busybox's
  ``sh`` (the examples say ``bash -c``), and the directories a driver mount
  lands in.

The images carry the names below; pods use them with ``imagePullPolicy:
Never`` (see :func:`localize_pod`). ``nvidia-smi`` is not in the image: as on a
GPU node it comes from the driver root through the claim's CDI spec.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.local import oci

PAUSE_IMAGE = "gpudra.local/pause:1"
BUSYBOX_IMAGE = "gpudra.local/busybox:1"
#: Where Debian's busybox-static puts the static binary.
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
_MTIME = 0  # every entry's time: archives of the same inputs are the same bytes

PAUSE_C = r"""
/* The pod sandbox's process: waits, reaps orphans, exits 0 on SIGINT/SIGTERM
   (what kubernetes/build/pause/linux/pause.c does, without its options). */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void down(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction stop = {.sa_handler = down}, child = {.sa_handler = reap};
    if (getpid() != 1) fprintf(stderr, "pause: not running as PID 1\n");
    sigaction(SIGINT, &stop, NULL);
    sigaction(SIGTERM, &stop, NULL);
    child.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
}
"""

BASH_STANDIN = '#!/bin/sh\n# bash stand-in of the gpudra test image\nexec /bin/sh "$@"\n'
ROOTFS_DIRS = ("bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr/bin", "usr/lib",
               "usr/lib/x86_64-linux-gnu", "var/run", "run")  # fmt: skip


class ImageError(RuntimeError):
    """An image could not be built (names the tool or file that is missing)."""


@dataclass(frozen=True)
class ImageArchive:
    name: str  # the image reference pods use
    path: Path  # the OCI archive


def unavailable() -> str | None:
    """Why the images cannot be built here (None: they can)."""
    if shutil.which("cc") is None:
        return "the pause image needs a C compiler (cc) with a static libc"
    if busybox() is None:
        return "the workload image needs Debian's busybox-static (make node-packages)"
    return None


def busybox() -> Path | None:
    """The static busybox binary, if installed (a dynamic one cannot run in an image)."""
    for candidate in BUSYBOX_PATHS:
        path = Path(candidate)
        if path.is_file() and _is_static(path):
            return path
    return None


def _is_static(path: Path) -> bool:
    """An ELF executable without a PT_INTERP program header (no dynamic loader)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    phoff = int.from_bytes(data[32:40], "little")
    phentsize = int.from_bytes(data[54:56], "little")
    phnum = int.from_bytes(data[56:58], "little")
    for i in range(phnum):
        kind = int.from_bytes(data[phoff + i * phentsize : phoff + i * phentsize + 4], "little")
        if kind == 3:  # PT_INTERP
            return False
    return True


def build(out: Path) -> tuple[ImageArchive, ImageArchive]:
    """Build both archives under ``out``: (pause, busybox)."""
    reason = unavailable()
    if reason:
        raise ImageError(reason)
    out.mkdir(parents=True, exist_ok=True)
    pause = _compile_pause(out)
    pause_image = _archive(
        out / "pause.oci.tar",
        PAUSE_IMAGE,
        lambda tar: _add_file(tar, "pause", pause.read_bytes(), 0o755),
        {"Entrypoint": ["/pause"]},
    )
    box = busybox()
    assert box is not None
    busybox_image = _archive(
        out / "busybox.oci.tar",
        BUSYBOX_IMAGE,
        lambda tar: _busybox_rootfs(tar, box),
        {"Cmd": ["/bin/sh"], "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
    )
    return pause_image, busybox_image


def _compile_pause(out: Path) -> Path:
    source = out / "pause.c"
    binary = out / "pause"
    source.write_text(PAUSE_C)
    done = subprocess.run(
        ["cc", "-static", "-Os", "-s", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ImageError(f"cc -static pause.c failed (a static libc is needed): {done.stderr}")
    return binary


def _applets(box: Path) -> list[str]:
    done = subprocess.run([str(box), "--list"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"{box} --list failed: {done.stderr.strip()}")
    return sorted(a for a in done.stdout.split() if a and "/" not in a)


def _busybox_rootfs(tar: tarfile.TarFile, box: Path) -> None:
    for d in ROOTFS_DIRS:
        _add_dir(tar, d)
    _add_file(tar, "bin/busybox", box.read_bytes(), 0o755)
    for applet in _applets(box):
        if applet != "busybox":
            _add_link(tar, f"bin/{applet}", "busybox")
    _add_file(tar, "bin/bash", BASH_STANDIN.encode(), 0o755)
    _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
    _add_file(tar, "etc/group", b"root:x:0:\n", 0o644)


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _MTIME
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, _MTIME
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, _MTIME
    tar.addfile(info)


def _archive(
    path: Path,
    name: str,
    fill: Callable[[tarfile.TarFile], None],
    config: Mapping[str, Any],
) -> ImageArchive:
    """An OCI image layout in a tar (services/local/oci.py): one uncompressed layer."""
    layer_path = path.with_name(path.name + ".layer")
    with tarfile.open(layer_path, mode="w", format=tarfile.PAX_FORMAT) as layer:
        fill(layer)
    try:
        layers = [oci.Layer.of(layer_path)]
        oci.write_archive(layers, oci.image_config(layers, config), name, path)
    finally:
        layer_path.unlink()
    return ImageArchive(name, path)


# ---- pods ------------------------------------------------------------------------


def localize_pod(pod: Mapping[str, Any], image: str = BUSYBOX_IMAGE) -> dict[str, Any]:
    """The pod with every container's image replaced by the local ``image``,
    never pulled (the examples name registry images a test machine cannot reach)."""
    out = json.loads(json.dumps(pod))
    spec = out.get("spec") or {}
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            container["image"] = image
            container["imagePullPolicy"] = "Never"
    return dict(out)


def localize(objects: Iterable[Mapping[str, Any]], image: str = BUSYBOX_IMAGE) -> list[Any]:
    """:func:`localize_pod` on every Pod of ``objects``; the others unchanged."""
    return [localize_pod(o, image) if o.get("kind") == "Pod" else dict(o) for o in objects]
