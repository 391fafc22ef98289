"""CDI spec generation in process: a claim's spec from a cached installation, and a discovery.

    python bench/cdi.py [--specs 5000] [--discoveries 50]

Over the simulated backend's driver root (services/preparer/devices/simroot.py,
laid out in a temporary directory), as the preparer renders it: ``cdi.render``
for one full GPU with the installation's common edits cached (what every
prepare pays: two stat calls to notice a changed driver, one for the hook, the
device's own edits, the spec), then the discovery of the installation itself
(what a prepare pays after a driver change). Prints p50/p99 and throughput of
each, and the peak RSS of this process.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.preparer import cdi  # noqa: E402
from services.preparer.cdigen.caps import TableCaps  # noqa: E402
from services.preparer.cdigen.generator import Generator, Options  # noqa: E402
from services.preparer.checkpoint import GroupState, PreparedDeviceState  # noqa: E402
from services.preparer.devices import simroot  # noqa: E402

VERSION = "580.95.05"
UID = "0e2f6c1a-8b3d-4c5e-9f70-1a2b3c4d5e6f"


def _figures(name: str, seconds: list[float]) -> None:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"{name}: p50 {statistics.median(ordered) * 1e6:8.1f} us   p99 {p99 * 1e6:8.1f} us   "
        f"{len(ordered) / sum(ordered):9.0f}/s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=5000)
    parser.add_argument("--discoveries", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cdi-") as tmp:
        root = simroot.build(Path(tmp) / "driver", VERSION)
        options = Options(driver_root=str(root), host_driver_root="/")
        devs = simroot.SimDevFs(lambda: (set(range(8)), False))
        gen = Generator(options, devs, TableCaps(simroot.CAPS_MAJOR), lambda: False)
        device = PreparedDeviceState(
            name="gpu-0", kind="gpu", requests=["r"], pool="n", gpu_uuid="GPU-0", gpu_minor=0
        )
        groups = [GroupState(kind="GpuConfig", origin="default")]
        spec = cdi.render(UID, [device], groups, gen, VERSION)
        mounts = len(spec["containerEdits"]["mounts"])
        print(f"simulated driver {VERSION}: {mounts} common mounts")
        times = []
        for _ in range(args.specs):
            start = time.perf_counter()
            cdi.render(UID, [device], groups, gen, VERSION)
            times.append(time.perf_counter() - start)
        _figures("claim spec (common edits cached)", times)
        times = []
        for _ in range(args.discoveries):
            fresh = Generator(options, devs, TableCaps(simroot.CAPS_MAJOR), lambda: False)
            start = time.perf_counter()
            fresh.common(VERSION)  # what a changed installation costs the next prepare
            times.append(time.perf_counter() - start)
        _figures("discovery of the installation  ", times)
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
