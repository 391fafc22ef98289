"""One driver installation under a root: its version, its library folder, its files.

This is the toolkit's ``root.Driver`` plus ``nvcdi``'s driver discoverers
(driver-nvml.go, graphics.go, ipc.go): the version comes from NVML when the
caller has it (discovery's inventory), else from the ``libcuda.so.<X.Y>`` /
``libnvidia-ml.so.<X.Y>`` file names, as the toolkit infers it. The library
folder is where that library really is; every ``*.so.<version>`` in it is a
driver library (not a fixed list).
"""

from __future__ import annotations

import fnmatch
import os
import platform
from dataclasses import dataclass

from services.preparer.cdigen import elf, hooks, lookup
from services.preparer.cdigen.model import (
    IPC_OPTIONS,
    LIBRARY_OPTIONS,
    CdiGenError,
    Found,
    Hook,
    Mount,
)

VERSION_LIBRARIES = ("libcuda.so.", "libnvidia-ml.so.")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
IPC_SOCKETS = ("/nvidia-persistenced/socket", "/nvidia-fabricmanager/socket")
GRAPHICS_CONFIGS = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
)
VULKAN_CONFIGS = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
)
_ARCH_ICD = {
    "x86_64": "vulkan/icd.d/nvidia_icd.x86_64.json",
    "aarch64": "vulkan/icd.d/nvidia_icd.aarch64.json",
}


@dataclass(frozen=True)
class Installation:
    """A driver installation as found: version and where its libraries are (relative to root)."""

    root: str
    version: str
    lib_dir: str  # e.g. /usr/lib/x86_64-linux-gnu, as inside the root
    libcuda: str  # the library the version was read from, full path (for change detection)


def find(root: str, nvml_version: str = "") -> Installation:
    """The installation under ``root``; ``nvml_version`` (NVML's) must match its libraries."""
    libs = lookup.Libraries(root)
    suffix = nvml_version or "*.*"
    for name in VERSION_LIBRARIES:
        found = libs.locate(name + suffix)
        if not found:
            continue
        version = os.path.basename(found[0]).removeprefix(name)
        if version:
            lib_dir = relative(root, os.path.dirname(found[0]))
            return Installation(root=root, version=version, lib_dir=lib_dir, libcuda=found[0])
    others = libs.locate("libcuda.so.*.*") or libs.locate("libnvidia-ml.so.*.*")
    if nvml_version and others:
        seen = f"; found {', '.join(os.path.basename(p) for p in others)}"
        raise CdiGenError(
            f"driver root {root}: no libcuda.so.{nvml_version} or libnvidia-ml.so.{nvml_version} "
            f"for the running driver {nvml_version} (NVML){seen}: the driver's files and the "
            "loaded driver differ (an upgrade not yet finished or not yet reloaded?)"
        )
    raise CdiGenError(
        f"driver root {root}: no NVIDIA driver libraries (libcuda.so.{nvml_version or '<version>'} "
        f"or libnvidia-ml.so.{nvml_version or '<version>'}) in the library folders or the "
        "ld.so.cache "
        "(is --driver-root the driver's root?)"
    )


def relative(root: str, path: str) -> str:
    """``path`` as seen inside ``root`` (the toolkit trims the root prefix)."""
    if root in ("", "/") or not os.path.isabs(path):
        return path
    return path.removeprefix(root)


def _mounts(
    root: str, located: list[str], options: tuple[str, ...] = LIBRARY_OPTIONS
) -> list[Mount]:
    base = os.path.join("/", root)
    out: list[Mount] = []
    seen: set[str] = set()
    for path in located:
        if path in seen:
            continue
        seen.add(path)
        inside = path if base == "/" else path.removeprefix(base)
        out.append(Mount(host_path=path, path=inside or path, options=options))
    return out


def libraries(inst: Installation) -> Found:
    """Every ``*.so.<version>`` beside libcuda (and in its vdpau folder), with their hooks."""
    dirs = [inst.lib_dir, os.path.join(inst.lib_dir, "vdpau")]
    libs = lookup.symlinks(inst.root, f"*.so.{inst.version}", dirs)
    located = [
        p for rel in (relative(inst.root, p) for p in libs) for p in lookup.files(inst.root, rel)
    ]
    mounts = _mounts(inst.root, located)
    found = Found(mounts=mounts)
    found.hooks += hooks.create_symlinks(_driver_links(mounts))
    found.hooks.append(Hook(hooks.ENABLE_CUDA_COMPAT, (f"--host-driver-version={inst.version}",)))
    found.hooks.append(Hook(hooks.UPDATE_LDCACHE, tuple(_library_folders(mounts))))
    found.hooks.append(Hook(hooks.DISABLE_DEVICE_NODE_MODIFICATION))
    found.env.append(f"NVIDIA_CTK_LIBCUDA_DIR={inst.lib_dir}")
    return found


def _driver_links(mounts: list[Mount]) -> list[str]:
    links: list[str] = []
    seen_paths: set[str] = set()
    for m in mounts:
        if m.path in seen_paths:
            continue
        seen_paths.add(m.path)
        for link in [*_special_links(m.path), *_soname_links(m.host_path, m.path)]:
            if link not in links:
                links.append(link)
    return links


def _matches(name: str, library: str) -> bool:
    return fnmatch.fnmatchcase(name, f"{library}.*.*")


def _special_links(path: str) -> list[str]:
    folder, name = os.path.split(path)
    if _matches(name, "libcuda.so"):
        return [f"libcuda.so.1::{os.path.join(folder, 'libcuda.so')}"]
    if _matches(name, "libGLX_nvidia.so"):
        return [f"{name}::{os.path.join(folder, 'libGLX_indirect.so.0')}"]
    if _matches(name, "libnvidia-opticalflow.so"):
        return [f"libnvidia-opticalflow.so.1::{os.path.join(folder, 'libnvidia-opticalflow.so')}"]
    return []


def _soname_links(host_path: str, path: str) -> list[str]:
    """``<soname> -> file`` and ``<name>.so -> <soname>`` where the host has those links."""
    host_dir = os.path.dirname(host_path)
    folder, name = os.path.split(path)
    if not _matches(name, "*"):
        return []
    try:
        so = elf.soname(host_path)
    except (OSError, elf.ElfError):
        return []  # the toolkit warns and goes on
    links = []
    if so != name and _is_link(os.path.join(host_dir, so)):
        links.append(f"{name}::{os.path.join(folder, so)}")
    target = so or name
    so_link = _so_link(target)
    if so_link and so_link != target and _is_link(os.path.join(host_dir, so_link)):
        links.append(f"{target}::{os.path.join(folder, so_link)}")
    return links


def _so_link(name: str) -> str:
    while True:
        stem, ext = os.path.splitext(name)
        if not ext:
            return ""
        if ext == ".so":
            return name
        name = stem


def _is_link(path: str) -> bool:
    return os.path.islink(path)


def _library_folders(mounts: list[Mount]) -> list[str]:
    folders: list[str] = []
    for m in mounts:
        base = os.path.basename(m.path)
        if not fnmatch.fnmatchcase(base, "lib?*.so*"):
            continue
        tail = base.split(".so")[-1]
        if len(base.split(".so")) > 1 and tail and not tail.startswith("."):
            continue
        folder = os.path.dirname(m.path)
        if folder and folder not in folders:
            folders.append(folder)
    return folders


def ipc_sockets(root: str) -> Found:
    """persistenced and fabricmanager sockets (under /run or /var/run), and an MPS pipe file."""
    found = [
        p for name in IPC_SOCKETS for p in lookup.files(root, name, ("/run", "/var/run"), count=1)
    ]
    found += lookup.files(root, "/tmp/nvidia-mps", count=1)  # a directory never matches
    return Found(mounts=_mounts(root, found, IPC_OPTIONS))


def firmware(inst: Installation, sysfs: str = "/sys") -> Found:
    """The version's GSP firmware, where the kernel would look for it."""
    paths: list[str] = []
    try:
        with open(os.path.join(sysfs, "module/firmware_class/parameters/path")) as f:
            custom = f.read().strip()
    except OSError:
        custom = ""
    if custom:
        paths.append(custom)
    release = platform.release()
    paths += [
        os.path.join("/lib/firmware/updates/", release),
        "/lib/firmware/updates/",
        os.path.join("/lib/firmware/", release),
        "/lib/firmware/",
    ]
    located = lookup.files(inst.root, os.path.join("nvidia", inst.version, "gsp*.bin"), paths)
    return Found(mounts=_mounts(inst.root, located))


def binaries(root: str) -> Found:
    located = [p for name in BINARIES for p in lookup.executable(root, name)]
    return Found(mounts=_mounts(root, located))


def graphics(inst: Installation) -> Found:
    """Graphics libraries, their links, and the EGL/Vulkan/X configs (the toolkit's common set)."""
    libs = lookup.Libraries(inst.root)
    located = [
        p
        for pattern in (
            "libnvidia-egl-gbm.so.*.*",
            "libnvidia-egl-wayland.so.*.*",
            f"libnvidia-allocator.so.{inst.version}",
            f"libnvidia-vulkan-producer.so.{inst.version}",
        )
        for p in libs.locate(pattern)
    ]
    lib_mounts = _mounts(inst.root, located)
    xorg = [
        p
        for name in ("nvidia_drv.so", f"libglxserver_nvidia.so.{inst.version}")
        for p in lookup.files(inst.root, name, _xorg_dirs(inst.lib_dir), count=1)
    ]
    lib_mounts += _mounts(inst.root, xorg)
    found = Found(
        mounts=[
            m
            for m in lib_mounts
            if not _matches(os.path.basename(m.path), "libnvidia-allocator.so")
        ]
    )
    found.mounts += _mounts(
        inst.root, [p for c in GRAPHICS_CONFIGS for p in lookup.files(inst.root, c, _config_dirs())]
    )
    found.mounts += _vulkan(inst.root)
    found.hooks += hooks.create_symlinks(_graphics_links(lib_mounts))
    return found


def _graphics_links(mounts: list[Mount]) -> list[str]:
    links = []
    for m in mounts:
        folder, name = os.path.split(m.path)
        if _matches(name, "libnvidia-allocator.so"):
            links.append(
                f"../libnvidia-allocator.so.1::{os.path.join(folder, 'gbm', 'nvidia-drm_gbm.so')}"
            )
        elif _matches(name, "libnvidia-vulkan-producer.so"):
            links.append(f"{name}::{os.path.join(folder, 'libnvidia-vulkan-producer.so')}")
        elif _matches(name, "libglxserver_nvidia.so"):
            links.append(f"{name}::{os.path.join(folder, 'libglxserver_nvidia.so')}")
    return links


def _config_dirs() -> list[str]:
    xdg = [d for d in os.environ.get("XDG_DATA_DIRS", "").split(os.pathsep) if d]
    return ["/etc", *(xdg or ["/usr/local/share", "/usr/share"])]


def _vulkan(root: str) -> list[Mount]:
    wanted = [*VULKAN_CONFIGS]
    if platform.machine() in _ARCH_ICD:
        wanted.append(_ARCH_ICD[platform.machine()])
    out: list[Mount] = []
    seen: set[str] = set()
    for target in wanted:
        found = lookup.files(root, target, _config_dirs()) or lookup.files(root, target)
        if not found or found[0] in seen:
            continue
        seen.add(found[0])
        out.append(Mount(host_path=found[0], path=os.path.join("/etc", target)))
    return out


def _xorg_dirs(lib_dir: str) -> list[str]:
    dirs = []
    if lib_dir:
        dirs += [os.path.join(lib_dir, "nvidia/xorg")] + [
            os.path.join(lib_dir, "xorg", sub, kind)
            for sub in ("modules", "modules/updates")
            for kind in ("drivers", "extensions")
        ]
    for base in ("/usr/lib/xorg", "/usr/lib64/xorg", "/usr/X11R6/lib", "/usr/X11R6/lib64"):
        dirs += [
            os.path.join(base, sub, kind)
            for sub in ("modules", "modules/updates")
            for kind in ("drivers", "extensions")
        ]
    return dirs
