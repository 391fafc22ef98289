"""The preparer over a real driver installation on disk: good and broken ones.

A fake NVIDIA installation (services/local/driverroot: real ELF libraries,
ldconfig's cache, binaries, firmware, mknod device nodes) stands where the
chart mounts the host's driver root; discovery simulates the same GPUs. Each
broken installation (no libraries, a device node that is not one, no
``nvidia-cdi-hook``, the driver's files upgraded under a running driver) must
be a clear error on the claim that names the path, leave no spec file and
no checkpoint entry, and leave the preparer serving the next claim.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.discovery.fleet import get_fleet
from services.local import driverroot
from services.local.driverroot import DriverRoot
from services.local.natsserver import NatsServer
from tests.helpers.preparer import Dev, Node, make_claim, validate_cdi_file

FLEET = "dgx-a100"
VERSION = get_fleet(FLEET).driver_version  # what the simulated NVML reports

pytestmark = pytest.mark.skipif(
    driverroot.unavailable() is not None, reason=str(driverroot.unavailable())
)


def flags(root: DriverRoot) -> list[str]:
    return [
        "--driver-root", str(root.driver_root), "--dev-root", str(root.dev_root),
        "--host-driver-root", "/", "--nvidia-cdi-hook-path", driverroot.HOOK,
    ]  # fmt: skip


async def started(
    short_root: Path, nats: NatsServer, bus: Bus, missing: Iterable[str] = ()
) -> tuple[Node, DriverRoot]:
    root = driverroot.build(short_root / "node", fleet=FLEET, version=VERSION, missing=missing)
    node = Node(short_root / "n", nats, bus, fleet=FLEET)
    node.root.mkdir()
    await node.start_discovery()
    await node.start_preparer(extra=flags(root))
    return node, root


@pytest.fixture
async def good(
    short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[tuple[Node, DriverRoot]]:
    node, root = await started(short_root, nats_server, bus)
    try:
        yield node, root
    finally:
        await node.close()


async def prepare_gpu(node: Node, device: str = "gpu-0", name: str = "c") -> tuple[str, str]:
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", device)], name=name))
    uid = claim.metadata.uid or ""
    return uid, (await node.prepare(claim)).claims[uid].error


def assert_nothing_for(node: Node, uid: str) -> None:
    assert not [p for p in node.cdi_files() if uid in p.name]
    assert uid not in node.checkpoint().claims


async def test_a_spec_from_the_installation_points_at_the_host(
    good: tuple[Node, DriverRoot],
) -> None:
    node, root = good
    _, error = await prepare_gpu(node)
    assert error == ""
    [path] = node.cdi_files()
    spec = validate_cdi_file(path)
    common = spec["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    for lib in root.libraries():
        inside = "/" + str(lib.relative_to(root.driver_root))
        assert mounts[inside] == inside  # the host's path, not the preparer's /driver-root
    assert {h["path"] for h in common["hooks"]} == {driverroot.HOOK}
    links = [a for h in common["hooks"] if "create-symlinks" in h["args"] for a in h["args"]]
    assert f"libcuda.so.{VERSION}::/usr/lib/x86_64-linux-gnu/libcuda.so.1" in links
    gpu = next(n for n in spec["devices"][0]["containerEdits"]["deviceNodes"])
    st = os.stat(root.dev_root / "dev" / "nvidia0")
    # The dev root is a path the host sees alike (as for the reference).
    assert (gpu["path"], gpu["hostPath"], gpu["major"], gpu["fileMode"]) == (
        "/dev/nvidia0", str(root.dev_root / "dev/nvidia0"), os.major(st.st_rdev),
        st.st_mode & 0o7777,
    )  # fmt: skip


async def test_an_upgrade_under_the_running_driver_fails_the_claim_not_the_node(
    good: tuple[Node, DriverRoot],
) -> None:
    node, root = good
    _, error = await prepare_gpu(node, "gpu-0", "before")
    assert error == ""
    before = node.cdi_files()[0].read_bytes()
    new = "590.10.01"
    for lib in root.lib_dir.glob(f"*.so.{VERSION}"):  # the installer replaced the files
        lib.rename(lib.with_name(lib.name.removesuffix(VERSION) + new))
    uid, error = await prepare_gpu(node, "gpu-1", "after")
    assert f"no libcuda.so.{VERSION}" in error and "libcuda.so.590.10.01" in error, error
    assert "loaded driver differ" in error
    assert_nothing_for(node, uid)
    assert node.cdi_files()[0].read_bytes() == before  # the prepared claim keeps its spec
    for lib in root.lib_dir.glob(f"*.so.{new}"):  # rolled back: the next claim works
        lib.rename(lib.with_name(lib.name.removesuffix(new) + VERSION))
    assert (await prepare_gpu(node, "gpu-1", "again"))[1] == ""


@pytest.mark.parametrize(
    ("missing", "needle"),
    [
        ({"libraries"}, "no NVIDIA driver libraries"),
        ({"nvidia-cdi-hook"}, "--nvidia-cdi-hook-path"),
        ({"nvidiactl"}, "no char device /dev/nvidiactl"),
    ],
)
async def test_a_broken_installation_is_an_error_on_the_claim(
    short_root: Path, nats_server: NatsServer, bus: Bus, missing: set[str], needle: str
) -> None:
    node, _ = await started(short_root, nats_server, bus, missing)
    try:
        uid, error = await prepare_gpu(node)
        assert needle in error, error
        assert_nothing_for(node, uid)
        preparer = node.procs[-1]
        assert preparer.alive()
        said = [
            line for line in preparer.output().splitlines() if "every prepare will fail" in line
        ]
        assert said and needle in said[0], preparer.output()  # said at start-up already
    finally:
        await node.close()


async def test_a_device_node_that_is_not_one_is_named(good: tuple[Node, DriverRoot]) -> None:
    node, root = good
    gpu_node = root.dev_root / "dev" / "nvidia1"
    gpu_node.unlink()
    gpu_node.write_text("not a device\n")  # e.g. a bind mount gone wrong
    uid, error = await prepare_gpu(node, "gpu-1")
    assert "no char device /dev/nvidia1" in error, error
    assert_nothing_for(node, uid)
    assert (await prepare_gpu(node, "gpu-0", "other"))[1] == ""
