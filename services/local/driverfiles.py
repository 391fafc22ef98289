"""The files of a fake driver installation (:mod:`services.local.driverroot`): the
driver's libraries, tools, firmware and IPC sockets.

The libraries are real ELF shared objects with the sonames a 580 ``.run`` install
has, compiled here with ``cc`` once per process and copied into each root, and
``etc/ld.so.cache`` is written by the real ``ldconfig -r``: NVIDIA's own CDI
generator finds the libraries the way it does on a GPU node.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from services.local.driverlayout import DriverLayout
from services.preparer.devices import simroot

MULTIARCH = "x86_64-linux-gnu"
LIB_DIR = f"usr/lib/{MULTIARCH}"


@dataclass(frozen=True)
class Library:
    """One driver library: ``<name>.<version>`` with its soname (None: the file's own name)."""

    name: str  # "libcuda.so"
    soname: str | None  # "libcuda.so.1"
    subdir: str = ""  # "vdpau"
    dev_link: bool = False  # the .run installer adds <name> -> soname


def _lib(name: str, major: str | None = "1", **kw: object) -> Library:
    return Library(name, f"{name}.{major}" if major else None, **kw)  # type: ignore[arg-type]


# The x86_64 library set of a 580 .run install: every file ends in the driver
# version, which is how NVIDIA's toolkit finds them (``*.so.<version>``).
DRIVER_LIBRARIES: tuple[Library, ...] = (
    _lib("libcuda.so", dev_link=True),
    _lib("libcudadebugger.so"),
    _lib("libnvidia-ml.so", dev_link=True),
    _lib("libnvidia-ptxjitcompiler.so"),
    _lib("libnvidia-nvvm.so", "4", dev_link=True),
    _lib("libnvidia-nvvm70.so", "4"),
    _lib("libnvidia-gpucomp.so", None),
    _lib("libnvidia-allocator.so"),
    _lib("libnvidia-cfg.so", dev_link=True),
    _lib("libnvidia-opencl.so"),
    _lib("libnvidia-opticalflow.so"),
    _lib("libnvidia-encode.so", dev_link=True),
    _lib("libnvcuvid.so", dev_link=True),
    _lib("libnvidia-fbc.so"),
    _lib("libnvoptix.so"),
    _lib("libnvidia-ngx.so"),
    _lib("libnvidia-sandboxutils.so"),
    _lib("libnvidia-vksc-core.so"),
    _lib("libnvidia-rtcore.so", None),
    _lib("libnvidia-glcore.so", None),
    _lib("libnvidia-eglcore.so", None),
    _lib("libnvidia-glsi.so", None),
    _lib("libnvidia-glvkspirv.so", None),
    _lib("libnvidia-tls.so", None),
    _lib("libnvidia-pkcs11.so", None),
    _lib("libnvidia-pkcs11-openssl3.so", None),
    _lib("libnvidia-present.so", None),
    _lib("libnvidia-wayland-client.so", None),
    _lib("libGLX_nvidia.so", "0"),
    _lib("libEGL_nvidia.so", "0"),
    _lib("libGLESv2_nvidia.so", "2"),
    _lib("libGLESv1_CM_nvidia.so"),
    _lib("libvdpau_nvidia.so", subdir="vdpau"),
)
# Shipped next to the driver but versioned on their own. The toolkit finds the
# EGL platform libraries through its graphics discovery (so it mounts those
# two); libnvidia-api is only taken with an opt-in feature flag. A generator
# that takes "every file ending in the driver version" sees none of them.
OTHER_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libnvidia-egl-wayland.so.1.1.19", "libnvidia-egl-wayland.so.1"),
    ("libnvidia-egl-gbm.so.1.1.2", "libnvidia-egl-gbm.so.1"),
    ("libnvidia-api.so.1", "libnvidia-api.so.1"),
)
# The simulated backend's driver root is the one list of tools and firmware; this
# fuller root adds nvidia-ctk for the reference generator it is compared with.
BINARIES = (*simroot.BINARIES, "nvidia-ctk")
FIRMWARE = simroot.FIRMWARE


@functools.cache
def _compiled_dir() -> Path:
    """Made once per process and removed when it exits: a process that never calls
    :func:`cleanup` (a test worker building driver roots) leaves nothing behind."""
    path = Path(tempfile.mkdtemp(prefix="gpudra-fake-elf-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def cleanup() -> None:
    """Remove this process's compiled objects (they are copied into each root)."""
    if _compiled_dir.cache_info().currsize:
        shutil.rmtree(_compiled_dir(), ignore_errors=True)
    for cached in (_compiled_dir, _shared_object, _executable):
        cached.cache_clear()


@functools.cache
def _shared_object(soname: str) -> Path:
    """A real ELF shared object whose DT_SONAME is ``soname`` (compiled once per process)."""
    out = _compiled_dir() / f"{soname}.built"
    src = _compiled_dir() / "lib.c"
    if not src.exists():
        src.write_text("int gpudra_fake_driver_symbol(void) { return 0; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    return out


@functools.cache
def _executable() -> Path:
    out = _compiled_dir() / "tool.built"
    src = _compiled_dir() / "tool.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["cc", "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def _install(src: Path, dst: Path, mode: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    os.chmod(dst, mode)


def libraries(root: DriverLayout, stale_version: str | None) -> None:
    libdir = root.driver_root / LIB_DIR
    libdir.mkdir(parents=True)
    if "libraries" not in root.missing:
        for lib in DRIVER_LIBRARIES:
            versioned = f"{lib.name}.{root.version}"
            path = libdir / lib.subdir / versioned
            _install(_shared_object(lib.soname or versioned), path, 0o755)
            if lib.dev_link and lib.soname:
                os.symlink(lib.soname, libdir / lib.subdir / lib.name)
        for name, soname in OTHER_LIBRARIES:
            _install(_shared_object(soname), libdir / name, 0o755)
        if stale_version:
            for name in ("libcuda.so", "libnvidia-ml.so"):
                _install(_shared_object(f"{name}.1"), libdir / f"{name}.{stale_version}", 0o755)
    # A library the system has anyway, so the cache is never empty.
    _install(_shared_object("libgpudra-system.so.1"), libdir / "libgpudra-system.so.1.0.0", 0o755)
    etc = root.driver_root / "etc"
    (etc / "ld.so.conf.d").mkdir(parents=True)
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (etc / "ld.so.conf.d" / f"{MULTIARCH}.conf").write_text(
        f"/usr/local/lib/{MULTIARCH}\n/lib/{MULTIARCH}\n/usr/lib/{MULTIARCH}\n"
    )
    if "ldcache" in root.missing:
        return
    links = ["-X"] if "soname-links" in root.missing else []
    subprocess.run(
        ["ldconfig", *links, "-r", str(root.driver_root)], check=True, capture_output=True
    )


def binaries(root: DriverLayout) -> None:
    if "binaries" in root.missing:
        return
    for name in BINARIES:
        if name == "nvidia-cdi-hook" and "nvidia-cdi-hook" in root.missing:
            continue
        _install(_executable(), root.driver_root / "usr" / "bin" / name, 0o755)


def firmware(root: DriverLayout) -> None:
    if "firmware" in root.missing:
        return
    firmware = root.driver_root / "lib" / "firmware" / "nvidia" / root.version
    firmware.mkdir(parents=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"\x7fELF-gsp-firmware")
        os.chmod(firmware / name, 0o644)


def _unix_socket(path: Path) -> None:
    """A real socket inode at ``path`` (bound short, then moved: sun_path holds 108 bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(str(path).encode()) < 100:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(path))
        return
    short = Path(tempfile.mkdtemp(prefix="gpudra-sock-")) / "s"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(short))
    os.rename(short, path)
    short.parent.rmdir()


def sockets(root: DriverLayout, fabricmanager: bool, host_mps: bool) -> None:
    run = root.driver_root / "run"
    if "persistenced-socket" not in root.missing:
        _unix_socket(run / "nvidia-persistenced" / "socket")
    if fabricmanager:
        _unix_socket(run / "nvidia-fabricmanager" / "socket")
    if host_mps:
        (root.driver_root / "tmp" / "nvidia-mps").mkdir(parents=True)
        _unix_socket(root.driver_root / "tmp" / "nvidia-mps" / "control")
