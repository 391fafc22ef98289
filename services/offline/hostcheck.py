"""``gpudra host-check``: this host's GPUs through the real NVML backend, side by side
with the simulated model of the same GPU, the slices gpudra would publish for them and
the CDI edits it would write.

    gpudra host-check [--driver-root /] [--scans 20] [--report FILE]

Why: the simulated backend is what every test runs on, so it must answer as NVML
does. On a node with a real GPU this prints, per GPU, every fact the inventory takes
from NVML next to what the simulated profile of the same PCI device id says, and
exits 1 when they differ (a profile to correct, or a backend bug). It never changes
the GPU (no MIG mode, compute mode or MPS): reads only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from services.core.kube import resource
from services.core.model import featuregates
from services.core.model.schemas import NodeInventory
from services.discovery import backend as nv
from services.discovery.fleet import Fleet, FleetGpu
from services.discovery.inventory import scan
from services.discovery.models import GpuModel, get_model, model_names
from services.discovery.nvml import NvmlBackend
from services.discovery.sim import SimNvml
from services.offline import slicecheck

# Every per-GPU query of the Backend protocol that the inventory or a profile uses.
QUERIES = (
    "uuid", "minor", "product_name", "brand", "architecture", "cuda_compute_capability",
    "memory_total", "pci_info", "addressing_mode", "pcie_root", "numa_node", "mig_mode",
    "gpu_instance_profiles", "mig_devices", "gpu_fabric_info",
)  # fmt: skip
# Facts that are the GPU's own (UUIDs, bus ids, minors) are not compared.
COMPARED = (
    "product_name",
    "brand",
    "architecture",
    "cuda_compute_capability",
    "memory_total",
    "addressing_mode",
    "mig_capable",
    "gpu_fabric_info",
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "host-check",
        help="compare this host's GPUs (real NVML) with their simulated models; "
        "print the slices and CDI edits gpudra would write (reads only)",
    )
    parser.add_argument("--driver-root", default="/", help="where the driver's files are")
    parser.add_argument(
        "--dev-root",
        default="",
        help="where /dev is (default: the driver root if it has one, else /)",
    )
    parser.add_argument(
        "--nvidia-cdi-hook-path",
        default=hooks_default(),
        help="the nvidia-cdi-hook the edits call (must exist under the driver root)",
    )
    parser.add_argument("--scans", type=int, default=20, help="inventory scans to time")
    parser.add_argument("--report", type=Path, help="write the whole report here as JSON")
    parser.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    be = NvmlBackend(sysfs_root=Path("/sys"), dev_root=Path("/dev"))
    try:
        be.init()
    except nv.NvmlError as exc:
        print(f"gpudra host-check: NVML: {exc}", file=sys.stderr)
        return 2
    try:
        report = check(
            be, args.driver_root, args.scans, args.nvidia_cdi_hook_path, dev_root=args.dev_root
        )
    finally:
        be.shutdown()
    if args.report:
        args.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
    _print(report)
    return 1 if report["differences"] or report["problems"] else 0


def hooks_default() -> str:
    from services.preparer.cdigen import hooks

    return hooks.DEFAULT_PATH


def check(
    be: nv.Backend,
    driver_root: str,
    scans: int,
    hook_path: str | None = None,
    *,
    dev_root: str = "",
) -> dict[str, Any]:
    node = os.uname().nodename
    report: dict[str, Any] = {"node": node, "driver": be.driver_version(), "gpus": []}
    report["cuda_driver_version"] = be.cuda_driver_version()
    report["backend"] = be.name
    # The Python binding NVML was read through (nvidia-ml-py's release), for the real backend.
    report["binding"] = getattr(be, "binding", None)
    differences: list[str] = []
    for index in range(be.device_count()):
        real = facts(be, index)
        model = model_for(real["pci_device_id"])
        entry: dict[str, Any] = {"index": index, "real": real, "model": None}
        if model is not None:
            sim = simulated(model, real)
            entry["model"] = model.model
            entry["simulated"] = sim
            differences += [f"GPU {index} ({model.model}): {d}" for d in compare(real, sim)]
        else:
            differences.append(f"GPU {index}: no simulated model for {real['pci_device_id']:#06x}")
        report["gpus"].append(entry)
    report["differences"] = differences
    report["problems"] = []
    report["scan"], inventory = _time_scans(be, node, scans)
    report["inventory"] = msgspec.to_builtins(inventory)
    report["slices"], problems = _slices(inventory)
    report["problems"] += problems
    report["cdi"], problems = _cdi(inventory, driver_root, hook_path or hooks_default(), dev_root)
    report["problems"] += problems
    return report


def facts(be: nv.Backend, index: int) -> dict[str, Any]:
    """Every fact the inventory or the simulated profile has, as NVML answers it."""
    out: dict[str, Any] = {}
    for name in QUERIES:
        try:
            out[name] = getattr(be, name)(index)
        except nv.NvmlError as exc:
            out[name] = f"error: {type(exc).__name__}: {exc}"
    pci = out.get("pci_info")
    out["pci_device_id"] = pci.device_id if isinstance(pci, nv.PciInfo) else 0
    out["mig_capable"] = isinstance(out.get("mig_mode"), tuple)
    # As JSON has it (lists, plain dicts), so a reading and a saved report compare equal.
    as_json: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(out))
    return as_json


def model_for(pci_device_id: int) -> GpuModel | None:
    for name in model_names():
        model = get_model(name)
        if model.pci_device_id == pci_device_id:
            return model
    return None


def simulated(model: GpuModel, real: dict[str, Any]) -> dict[str, Any]:
    """The same facts from a one-GPU simulated node of ``model``."""
    fleet = Fleet(
        name="host-check",
        description="one GPU of the host's model",
        driver_version="0.0",
        cuda_driver_version="12.8",
        gpus=[FleetGpu(model=model.model, pci_bus_id="0000:01:00.0", iommu_group=1)],
    )
    sim = SimNvml.boot("host-check", fleet, seed=0)
    try:
        # The simulated GPU's MIG mode follows the real one's, so profiles are comparable.
        mig = real.get("mig_mode")
        if isinstance(mig, list) and mig[0]:
            sim.set_mig_mode(0, True)
        return facts(sim, 0)
    finally:
        sim.shutdown()


def compare(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    keys = [k for k in COMPARED if k in real]  # a saved reading may predate a fact
    out = [
        f"{k}: NVML {real[k]!r}, simulated {sim.get(k)!r}" for k in keys if real[k] != sim.get(k)
    ]
    return out + _compare_profiles(
        real.get("gpu_instance_profiles"), sim.get("gpu_instance_profiles")
    )


def _compare_profiles(real: Any, sim: Any) -> list[str]:
    if not isinstance(real, list) or not isinstance(sim, list):
        return [] if type(real) is type(sim) else [f"MIG profiles: NVML {real}, simulated {sim}"]
    by_name = {p["name"]: p for p in sim}
    out = []
    for p in real:
        twin = by_name.pop(p["name"], None)
        if twin is None:
            out.append(f"MIG profile {p['name']}: only NVML has it ({p})")
            continue
        for key, value in p.items():
            if twin.get(key) != value:
                out.append(
                    f"MIG profile {p['name']}.{key}: NVML {value!r}, simulated {twin.get(key)!r}"
                )
    out += [f"MIG profile {name}: only the simulated model has it" for name in by_name]
    return out


def _time_scans(be: nv.Backend, node: str, n: int) -> tuple[dict[str, float], NodeInventory]:
    """``n`` timed inventory scans, and the last one's inventory."""
    times = []
    for _ in range(max(n, 1)):
        start = time.perf_counter()
        inventory = scan(be, node).inventory
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    figures = {
        "scans": len(times),
        "p50_ms": round(times[len(times) // 2], 3),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 3),
    }
    return figures, inventory


def _slices(inventory: Any) -> tuple[list[dict[str, Any]], list[str]]:
    from services.publisher.render import RenderError, RenderOptions, render_slices

    try:
        slices = render_slices(inventory, RenderOptions(gates=featuregates.parse("")), generation=1)
    except RenderError as exc:
        return [], [f"slices: {exc}"]
    problems = [f"slices: {p}" for p in slicecheck.check_pool(slices)]
    return [resource.to_builtins(s) for s in slices], problems


def _cdi(
    inventory: Any, driver_root: str, hook_path: str, dev_root: str
) -> tuple[dict[str, Any], list[str]]:
    """Each GPU's CDI edits from the driver root, and any host path they name that is missing."""
    from services.preparer.cdigen.caps import ProcCaps
    from services.preparer.cdigen.devfs import HostDevFs, dev_root_of
    from services.preparer.cdigen.generator import Generator, Options
    from services.preparer.cdigen.model import CdiGenError

    fs = HostDevFs(dev_root or dev_root_of(driver_root))
    # This process runs on the host itself: the driver root is the host's own path.
    options = Options(driver_root=driver_root, host_driver_root=driver_root, hook_path=hook_path)
    gen = Generator(options, fs, ProcCaps("/proc"), lambda: False)
    problems: list[str] = []
    try:
        common = gen.common_edits(inventory.driver_version)
        gpus = {g.uuid: gen.gpu_edits(g.minor, g.pci_bus_id) for g in inventory.gpus}
    except CdiGenError as exc:
        return {}, [*problems, f"cdi: {exc}"]
    for edits in (common, *gpus.values()):
        problems += [f"cdi: {p}" for p in _missing(edits)]
    return {"common": common, "gpus": gpus}, problems


def _missing(edits: dict[str, Any]) -> Iterator[str]:
    for mount in edits.get("mounts", []):
        if not os.path.lexists(mount["hostPath"]):
            yield f"mount source {mount['hostPath']} does not exist"
    for node in edits.get("deviceNodes", []):
        path = node.get("hostPath") or node["path"]
        if not os.path.exists(path):
            yield f"device node {path} does not exist"


def _print(report: dict[str, Any]) -> None:
    binding = f", {report['binding']}" if report.get("binding") else ""
    print(
        f"node {report['node']}: driver {report['driver']}, "
        f"CUDA {report['cuda_driver_version']}{binding}"
    )
    for gpu in report["gpus"]:
        real = gpu["real"]
        print(
            f"GPU {gpu['index']}: {real.get('product_name')} ({real['pci_device_id']:#06x}), "
            f"model {gpu['model']}, memory {real.get('memory_total')} B, MIG {real.get('mig_mode')}"
        )
    scans = report["scan"]
    print(f"inventory scan: p50 {scans['p50_ms']} ms, p99 {scans['p99_ms']} ms ({scans['scans']})")
    devices = sum(len(s["spec"].get("devices", [])) for s in report["slices"])
    print(f"slices: {len(report['slices'])}, devices {devices}")
    cdi = report["cdi"]
    if cdi:
        print(
            f"cdi: {len(cdi['common'].get('mounts', []))} mounts, "
            f"{len(cdi['common'].get('hooks', []))} hooks, "
            f"{len(cdi['common'].get('deviceNodes', []))} control nodes"
        )
    for line in report["differences"]:
        print(f"difference: {line}")
    for line in report["problems"]:
        print(f"problem: {line}")


def main(argv: list[str] | None = None) -> int:
    """``python -m services.offline.hostcheck``: the check without the whole CLI's imports."""
    parser = argparse.ArgumentParser(prog="gpudra")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["host-check", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
