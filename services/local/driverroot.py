"""A fake NVIDIA driver installation on disk, real enough for NVIDIA's own CDI generator.

CDI tests and the real nodes (:mod:`services.local.node`) need what a GPU node
has, not what our generator expects: the driver's whole library set as real ELF
shared objects with versioned sonames
(compiled here with ``cc``), the symlinks an install has and lacks, an
``etc/ld.so.cache`` written by the real ``ldconfig -r``, the driver's binaries,
GSP firmware, IPC sockets, a ``/proc`` stand-in, a sysfs for the PCI devices
and real character device nodes made with ``mknod``. The GPUs are the
simulated fleet's (``services.discovery``), so the NVML facts written to
``facts.json`` (for the reference generator's mock NVML) and the files on disk
describe the same node.

Layout under ``base``::

    driver/   the driver root: usr/lib/<multiarch>, usr/bin, lib/firmware, etc/ld.so.cache, run/
    host/     the dev root (host/dev/..., or driver/dev/...) and host/sys (PCI devices)
    proc/     devices, driver/nvidia/{version,gpus,capabilities}, driver/nvidia-caps/mig-minors
    facts.json

Building needs root (mknod, ``ldconfig -r`` chroots): :func:`unavailable`
says why not, for a clear ``pytest.skip``. Leave pieces out with ``missing``
(see :data:`PIECES`) to build the broken installations bad-input tests need.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from services.core.model.nvidia import mig_device_name
from services.discovery.fleet import Fleet, get_fleet
from services.discovery.models import get_model
from services.discovery.sim import SimNvml
from services.preparer.devices import simroot

DEFAULT_VERSION = "580.95.05"
DEFAULT_CUDA = 13000  # NVML's integer CUDA driver version for 580 (13.0)
MULTIARCH = "x86_64-linux-gnu"
LIB_DIR = f"usr/lib/{MULTIARCH}"
HOOK = "/usr/bin/nvidia-cdi-hook"  # where nvidia-cdi-hook lives, relative to the driver root

# Char majors: 195 is fixed by the nvidia module, 10 is misc; the others are
# dynamic on a real node, these are what one H100 node had.
NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 511
VFIO_GROUP_MAJOR = 505
VFIO_DEV_MAJOR = 506
MISC_MAJOR = 10
VFIO_MISC_MINOR = 196
IOMMU_MISC_MINOR = 123


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

# What ``missing`` may name.
PIECES = frozenset(
    {
        "libraries",  # no NVIDIA library at all
        "ldcache",  # no etc/ld.so.cache
        "soname-links",  # ldconfig -X: no libcuda.so.1 -> libcuda.so.<version>
        "firmware",
        "binaries",  # none of BINARIES (nvidia-cdi-hook included)
        "nvidia-cdi-hook",  # only the hook
        "persistenced-socket",
        "proc",
        "gpu-nodes",  # /dev/nvidia<minor>
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
        "caps-nodes",  # /dev/nvidia-caps/*
        "vfio-nodes",  # /dev/vfio/*, /dev/iommu
    }
)


@dataclass(frozen=True)
class FakeMig:
    """A MIG device as NVML and /proc/driver/nvidia/capabilities describe it."""

    uuid: str
    parent_uuid: str
    parent_minor: int
    profile: str  # "1g.10gb"
    gi_profile_id: int
    placement_start: int
    placement_size: int
    gi_id: int
    ci_id: int
    gi_cap_minor: int  # /dev/nvidia-caps/nvidia-cap<N> of the GPU instance
    ci_cap_minor: int  # ... and of the compute instance

    @property
    def device_name(self) -> str:
        """The DRA device name, as the publisher names it."""
        return mig_device_name(
            self.parent_minor, self.profile, self.gi_profile_id, self.placement_start
        )


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    minor: int
    pci_bus_id: str
    model: str
    iommu_group: int
    vfio_dev: str  # "vfio3": its /dev/vfio/devices cdev when IOMMUFD is on
    migs: tuple[FakeMig, ...] = ()


@dataclass(frozen=True)
class DriverRoot:
    """A built fake installation; paths are absolute on this machine."""

    base: Path
    driver_root: Path  # the host's driver root (as the toolkit's --driver-root)
    dev_root: Path  # contains dev/ (as the toolkit's --dev-root)
    proc: Path  # stands in for /proc
    sysfs: Path  # stands in for /sys
    facts_file: Path  # NVML facts for the reference generator's mock NVML
    version: str
    cuda_version: int
    fleet: str
    iommufd: bool
    gpus: tuple[FakeGpu, ...]
    missing: frozenset[str] = field(default_factory=frozenset)

    @property
    def hook_path(self) -> str:
        """nvidia-cdi-hook's path on the host."""
        return str(self.driver_root) + HOOK

    @property
    def lib_dir(self) -> Path:
        return self.driver_root / LIB_DIR

    def libraries(self) -> list[Path]:
        """The driver's versioned library files (what a generator must mount)."""
        if "libraries" in self.missing:
            return []
        return [
            self.lib_dir / lib.subdir / f"{lib.name}.{self.version}" for lib in DRIVER_LIBRARIES
        ]

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def migs(self) -> list[FakeMig]:
        return [m for g in self.gpus for m in g.migs]


def unavailable() -> str | None:
    """Why a fake root cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "the fake driver root needs root (mknod, ldconfig -r chroots); CI runs as uid 0"
    for tool in ("cc", "ldconfig"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"the fake driver root needs {tool}"
    return None


def build(
    base: Path,
    *,
    fleet: str = "dgx-a100",
    version: str = DEFAULT_VERSION,
    cuda_version: int = DEFAULT_CUDA,
    mig: bool = True,
    iommufd: bool = False,
    fabricmanager: bool = False,
    host_mps: bool = False,
    stale_version: str | None = None,
    dev_in_driver_root: bool = False,
    missing: Iterable[str] = (),
    node: str = "node-1",
    seed: int = 0,
) -> DriverRoot:
    """Build the installation under ``base`` (created; must not hold another one).

    ``mig`` keeps the fleet's static MIG layouts (off: every GPU whole);
    ``iommufd`` gives the host /dev/iommu and per-device vfio cdevs;
    ``fabricmanager`` and ``host_mps`` add those daemons' IPC files;
    ``stale_version`` leaves a previous driver's libcuda/libnvidia-ml behind;
    ``dev_in_driver_root`` puts dev/ inside the driver root (the host's / as the
    driver root, the chart's default) instead of under ``host/``.
    """
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    gone = frozenset(missing)
    if unknown := gone - PIECES:
        raise ValueError(f"missing: unknown pieces {sorted(unknown)}; known: {sorted(PIECES)}")
    root = DriverRoot(
        base=base,
        driver_root=base / "driver",
        dev_root=base / "driver" if dev_in_driver_root else base / "host",
        proc=base / "proc",
        sysfs=base / "host" / "sys",
        facts_file=base / "facts.json",
        version=version,
        cuda_version=cuda_version,
        fleet=fleet,
        iommufd=iommufd,
        gpus=_gpus(get_fleet(fleet), node, seed, mig),
        missing=gone,
    )
    for d in (root.driver_root, root.dev_root / "dev", root.proc, root.sysfs):
        d.mkdir(parents=True)
    _libraries(root, stale_version)
    _binaries(root)
    _firmware(root)
    _sockets(root, fabricmanager, host_mps)
    _device_nodes(root)
    _sysfs(root)
    if "proc" not in gone:
        _proc(root)
    root.facts_file.write_text(json.dumps(facts(root), indent=1))
    return root


# ---------------------------------------------------------------- GPUs


def _gpus(fleet: Fleet, node: str, seed: int, mig: bool) -> tuple[FakeGpu, ...]:
    if not mig:
        fleet = msgspec.structs.replace(
            fleet, gpus=[msgspec.structs.replace(g, mig=None) for g in fleet.gpus]
        )
    sim = SimNvml.boot(node, fleet, seed)
    out = []
    for i, g in enumerate(sim.state.gpus):
        migs = []
        spec = get_model(g.model).mig
        profiles = {p.id: p.name for p in spec.profiles} if spec else {}
        for gi in sorted(g.gpu_instances, key=lambda x: x.start):
            for ci in gi.compute_instances:
                gi_minor, ci_minor = mig_cap_minors(g.minor, gi.id, ci.id)
                migs.append(
                    FakeMig(
                        uuid=ci.uuid,
                        parent_uuid=g.uuid,
                        parent_minor=g.minor,
                        profile=profiles[gi.profile_id],
                        gi_profile_id=gi.profile_id,
                        placement_start=gi.start,
                        placement_size=gi.size,
                        gi_id=gi.id,
                        ci_id=ci.id,
                        gi_cap_minor=gi_minor,
                        ci_cap_minor=ci_minor,
                    )
                )
        out.append(
            FakeGpu(
                index=i,
                uuid=g.uuid,
                minor=g.minor,
                pci_bus_id=g.pci_bus_id,
                model=g.model,
                iommu_group=g.iommu_group,
                vfio_dev=f"vfio{i}",
                migs=tuple(migs),
            )
        )
    return tuple(out)


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """The nvidia module's capability minors (nv-caps.c's static table), written out
    here on their own so that the reference sees the kernel's numbers, not ours."""
    per_gi, per_gpu = 9, 15 * 9  # an "access" node + 8 compute instances per GI
    gi_minor = 3 + gpu_minor * per_gpu + gi_id * per_gi
    return gi_minor, gi_minor + 1 + ci_id


def facts(root: DriverRoot) -> dict[str, object]:
    """What NVML says about this node, for the reference generator's mock NVML."""
    gpus = []
    for g in root.gpus:
        model = get_model(g.model)
        gpus.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "minor": g.minor,
                "pciBusId": g.pci_bus_id,
                "pciDeviceId": model.pci_device_id,
                "name": model.product_name,
                "brand": model.brand,
                "architecture": model.architecture,
                "cudaComputeCapability": list(model.cuda_compute_capability),
                "memoryMiB": model.memory_mib,
                "migEnabled": bool(g.migs),
                "migDevices": [
                    {
                        "uuid": m.uuid,
                        "giId": m.gi_id,
                        "ciId": m.ci_id,
                        "profile": m.profile,
                        "giProfileId": m.gi_profile_id,
                        "placementStart": m.placement_start,
                        "placementSize": m.placement_size,
                    }
                    for m in g.migs
                ],
            }
        )
    return {"driverVersion": root.version, "cudaDriverVersion": root.cuda_version, "gpus": gpus}


# ---------------------------------------------------------------- files


@functools.cache
def _compiled_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gpudra-fake-elf-"))


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


def _libraries(root: DriverRoot, stale_version: str | None) -> None:
    libdir = root.lib_dir
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


def _binaries(root: DriverRoot) -> None:
    if "binaries" in root.missing:
        return
    for name in BINARIES:
        if name == "nvidia-cdi-hook" and "nvidia-cdi-hook" in root.missing:
            continue
        _install(_executable(), root.driver_root / "usr" / "bin" / name, 0o755)


def _firmware(root: DriverRoot) -> None:
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


def _sockets(root: DriverRoot, fabricmanager: bool, host_mps: bool) -> None:
    run = root.driver_root / "run"
    if "persistenced-socket" not in root.missing:
        _unix_socket(run / "nvidia-persistenced" / "socket")
    if fabricmanager:
        _unix_socket(run / "nvidia-fabricmanager" / "socket")
    if host_mps:
        (root.driver_root / "tmp" / "nvidia-mps").mkdir(parents=True)
        _unix_socket(root.driver_root / "tmp" / "nvidia-mps" / "control")


def _mknod(path: Path, major: int, minor: int, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # the umask may have trimmed it


def _device_nodes(root: DriverRoot) -> None:
    dev, gone = root.dev_root / "dev", root.missing
    if "gpu-nodes" not in gone:
        for g in root.gpus:
            _mknod(dev / f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor, 0o666)
    control = {
        "nvidiactl": (NVIDIA_MAJOR, 255),
        "nvidia-modeset": (NVIDIA_MAJOR, 254),
        "nvidia-uvm": (UVM_MAJOR, 0),
        "nvidia-uvm-tools": (UVM_MAJOR, 1),
    }
    for name, (major, minor) in control.items():
        if name not in gone:
            _mknod(dev / name, major, minor, 0o666)
    if "caps-nodes" not in gone:
        caps = dev / "nvidia-caps"
        _mknod(caps / "nvidia-cap1", CAPS_MAJOR, 1, 0o400)  # mig/config
        _mknod(caps / "nvidia-cap2", CAPS_MAJOR, 2, 0o444)  # mig/monitor
        for m in root.migs():
            _mknod(caps / f"nvidia-cap{m.gi_cap_minor}", CAPS_MAJOR, m.gi_cap_minor, 0o444)
            _mknod(caps / f"nvidia-cap{m.ci_cap_minor}", CAPS_MAJOR, m.ci_cap_minor, 0o444)
    if "vfio-nodes" not in gone:
        _mknod(dev / "vfio" / "vfio", MISC_MAJOR, VFIO_MISC_MINOR, 0o666)
        for i, g in enumerate(root.gpus):
            _mknod(dev / "vfio" / str(g.iommu_group), VFIO_GROUP_MAJOR, i, 0o600)
            if root.iommufd:
                _mknod(dev / "vfio" / "devices" / g.vfio_dev, VFIO_DEV_MAJOR, i, 0o600)
        if root.iommufd:
            _mknod(dev / "iommu", MISC_MAJOR, IOMMU_MISC_MINOR, 0o666)


def _sysfs(root: DriverRoot) -> None:
    """PCI devices as go-nvlib's nvpci and our VFIO code read them (GPUs bound to vfio-pci)."""
    sys_root = root.sysfs
    devices = sys_root / "bus" / "pci" / "devices"
    drivers = sys_root / "bus" / "pci" / "drivers"
    groups = sys_root / "kernel" / "iommu_groups"
    for d in (
        devices,
        drivers / "vfio-pci",
        drivers / "nvidia",
        groups,
    ):
        d.mkdir(parents=True, exist_ok=True)
    for g in root.gpus:
        model = get_model(g.model)
        device = sys_root / "devices" / "pci0000:00" / g.pci_bus_id
        device.mkdir(parents=True)
        files = {
            "vendor": "0x10de",
            "device": f"0x{model.pci_device_id:04x}",
            "class": "0x030200",
            "numa_node": "-1",
            "resource": "0x00000000ac000000 0x00000000acffffff 0x0000000000040200\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000",
            "sriov_totalvfs": "0",
            "sriov_numvfs": "0",
        }
        for name, text in files.items():
            (device / name).write_text(text + "\n")
        group = groups / str(g.iommu_group)
        (group / "devices").mkdir(parents=True)
        os.symlink(os.path.relpath(group, device), device / "iommu_group")
        os.symlink(os.path.relpath(device, group / "devices"), group / "devices" / g.pci_bus_id)
        os.symlink(os.path.relpath(drivers / "vfio-pci", device), device / "driver")
        if root.iommufd:
            (device / "vfio-dev" / g.vfio_dev).mkdir(parents=True)
        os.symlink(os.path.relpath(device, devices), devices / g.pci_bus_id)


def _proc(root: DriverRoot) -> None:
    proc = root.proc
    (proc / "devices").write_text(
        "Character devices:\n  1 mem\n  4 tty\n 10 misc\n"
        f"{NVIDIA_MAJOR} nvidia-frontend\n{VFIO_GROUP_MAJOR} vfio\n{VFIO_DEV_MAJOR} vfio-dev\n"
        f"{UVM_MAJOR} nvidia-uvm\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  8 sd\n"
    )
    nv = proc / "driver" / "nvidia"
    (nv / "gpus").mkdir(parents=True)
    (nv / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {root.version}  "
        "Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    for g in root.gpus:
        info = nv / "gpus" / g.pci_bus_id
        info.mkdir()
        (info / "information").write_text(
            f"Model: \t\t {get_model(g.model).product_name}\nIRQ:   \t\t 0\n"
            f"GPU UUID: \t {g.uuid}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\n"
            f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {g.pci_bus_id}\n"
            f"Device Minor: \t {g.minor}\nGPU Firmware: \t {root.version}\nGPU Excluded:\t No\n"
        )
    caps = nv / "capabilities"
    _cap_file(caps / "mig" / "config", 1, 0o400)
    _cap_file(caps / "mig" / "monitor", 2, 0o444)
    for m in root.migs():
        gi = caps / f"gpu{m.parent_minor}" / "mig" / f"gi{m.gi_id}"
        _cap_file(gi / "access", m.gi_cap_minor, 0o444)
        _cap_file(gi / f"ci{m.ci_id}" / "access", m.ci_cap_minor, 0o444)
    lines = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi_id in range(15):
            gi_minor, _ = mig_cap_minors(gpu, gi_id, 0)
            lines.append(f"gpu{gpu}/gi{gi_id}/access {gi_minor}")
            lines += [f"gpu{gpu}/gi{gi_id}/ci{ci}/access {gi_minor + 1 + ci}" for ci in range(8)]
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text("\n".join(lines) + "\n")


def _cap_file(path: Path, minor: int, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
