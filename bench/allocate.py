"""Benchmark: allocate 5,000 claims one after another over 550 rendered nodes (no --node).

Inputs: 500 dgx-h100 nodes and 50 dgx-a100 nodes with DynamicMIG, their slices
rendered by our publisher (``gpudra slices``, one render per fleet, renamed per
node); claims: single GPUs with a CEL memory selector, 1g MIG partitions, and
GPU pairs with ``matchAttribute`` on pcieRoot. Prints claims/s, p50/p99 per
claim and peak RSS. Usage: ``python bench/allocate.py [--claims N] [--h100 N] [--a100 N]``.
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import time
from contextlib import redirect_stdout
from typing import Any

import msgspec
import yaml

from services.allocator import features as kube_features
from services.allocator.inputs import Inputs
from services.allocator.offline import OfflineAllocator
from services.cli import main as gpudra
from services.core.resource import DeviceClass, ResourceClaim, ResourceSlice

TEMPLATE = "templatenode"
PROFILE_1G = 'device.attributes["gpu.nvidia.com"].profile == "1g.5gb"'


def _render(fleet: str, gates: str) -> str:
    out = io.StringIO()
    argv = ["slices", "--fleet", fleet, "--node", TEMPLATE, "-o", "yaml"]
    with redirect_stdout(out):
        assert gpudra([*argv, "--feature-gates", gates] if gates else argv) == 0
    return out.getvalue()


def _slices(text: str, node: str) -> list[ResourceSlice]:
    docs = [d for d in yaml.safe_load_all(text.replace(TEMPLATE, node)) if d]
    return [msgspec.convert(d, ResourceSlice) for d in docs]


def _class(name: str, kind: str) -> DeviceClass:
    expression = (
        f'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "{kind}"'
    )
    return msgspec.convert(
        {
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        },
        DeviceClass,
    )


def _claim(index: int) -> ResourceClaim:
    kind = index % 25  # 16 single GPUs, 7 MIG partitions, 2 pairs: fills the fleet exactly
    if kind < 16:  # one big GPU
        requests: list[dict[str, Any]] = [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "selectors": [
                        {
                            "cel": {
                                "expression": 'device.capacity["gpu.nvidia.com"].memory'
                                '.compareTo(quantity("64Gi")) >= 0'
                            }
                        }
                    ],
                },
            }
        ]
        constraints: list[dict[str, Any]] = []
    elif kind < 23:  # a 1g MIG partition
        requests = [
            {
                "name": "mig",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": PROFILE_1G}}],
                },
            }
        ]
        constraints = []
    else:  # two GPUs under one PCIe root
        requests = [{"name": "pair", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]
        constraints = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    spec = {"devices": {"requests": requests, "constraints": constraints or None}}
    return msgspec.convert(
        {"metadata": {"name": f"claim-{index:05d}", "namespace": "bench"}, "spec": spec},
        ResourceClaim,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=5000)
    parser.add_argument("--h100", type=int, default=500)
    parser.add_argument("--a100", type=int, default=50)
    args = parser.parse_args()

    start = time.perf_counter()
    h100, a100 = _render("dgx-h100", ""), _render("dgx-a100", "DynamicMIG=true")
    inputs = Inputs(
        classes={
            "gpu.nvidia.com": _class("gpu.nvidia.com", "gpu"),
            "mig.nvidia.com": _class("mig.nvidia.com", "mig"),
        }
    )
    for i in range(args.h100):
        inputs.slices += _slices(h100, f"h100-{i:04d}")
    for i in range(args.a100):
        inputs.slices += _slices(a100, f"a100-{i:04d}")
    inputs.claims = [_claim(i) for i in range(args.claims)]
    devices = sum(len(s.spec.devices or []) for s in inputs.slices)
    setup = time.perf_counter() - start

    features = kube_features.parse("DRAPartitionableDevices=true")
    allocator = OfflineAllocator(inputs, features)
    nodes = allocator.nodes(None)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    begin = time.perf_counter()
    for claim in inputs.claims:
        t0 = time.perf_counter()
        outcome = allocator.allocate(claim, nodes)
        latencies.append(time.perf_counter() - t0)
        statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
    elapsed = time.perf_counter() - begin

    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"nodes: {len(nodes)}  slices: {len(inputs.slices)}  devices: {devices}")
    print(f"setup (render + decode): {setup:.1f} s")
    print(f"claims: {len(inputs.claims)}  outcomes: {statuses}")
    print(f"throughput: {len(inputs.claims) / elapsed:.0f} claims/s  ({elapsed:.2f} s)")
    print(
        f"per claim: p50 {statistics.median(latencies) * 1e3:.2f} ms  "
        f"p99 {p99 * 1e3:.2f} ms  max {latencies[-1] * 1e3:.1f} ms"
    )
    print(f"peak RSS: {rss_mib:.0f} MiB")


if __name__ == "__main__":
    main()
