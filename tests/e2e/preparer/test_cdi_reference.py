"""gpudra's claim CDI specs against the reference driver's, edit by edit.

Both generators are given the same fake node (services/local/driverroot.py:
real ELF libraries, ldconfig's cache, mknod device nodes, /proc and sysfs
stand-ins; the simulated dgx-a100 fleet with driver 580.95.05) and the same
claim. The reference's spec comes from ``controlplane reference-cdi``: NVIDIA's
Container Toolkit library (pkg/nvcdi v1.19.0) called the way the reference
driver's gpu-kubelet-plugin calls it, with the toolkit's root transform from
the container driver root to the host's. gpudra's comes from the preparer's
code (tests/helpers/cdigen.py). The comparison sorts lists and nothing else.

Most cases lay the node out as under the GPU operator: the host's driver root
is ``/run/nvidia/driver``, the plugin sees it at the fake root's ``driver/``,
/dev is a path both see alike. ``gpu-host-root`` is the chart's default: the
host's / is the driver root and holds dev/. nvidia-cdi-hook was copied into the
kubelet plugin directory, as the reference's plugin does.

Run with ``-s`` to see every difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.local import driverroot as dr
from services.preparer import cdi
from tests.helpers.cdi import inject
from tests.helpers.cdicompare import (
    ClaimCase,
    Difference,
    Kept,
    compare,
    reference_spec,
    summary,
)
from tests.helpers.cdigen import gpudra_spec

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(dr.unavailable() is not None, reason=str(dr.unavailable())),
]

UID = "6a1d3c9e-2b4f-4e8a-9c7d-0f1e2d3c4b5a"
HOST_DRIVER_ROOT = "/run/nvidia/driver"
HOOK = "/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook"

#: THE table of differences gpudra keeps on purpose, each with its reason (and a
#: row in docs/differences.md). A difference not covered here fails. Each row
#: names the device nodes it applies to (by kind: the NVIDIA nodes the toolkit
#: reads, the VFIO nodes the reference writes as bare paths) and the fields that
#: may differ; :func:`intentional` expands it into ``Kept`` entries for the
#: node's concrete paths.
NODE_TYPE = (
    "gpudra writes the type (c) it read with lstat, with the numbers it read; the toolkit"
    " leaves it out and the runtime stats the node again (and a simulated node's nodes,"
    " which exist only in the simulation, would not inject without it)"
)
VFIO_NUMBERS = (
    "gpudra reads VFIO nodes at the dev root and writes their numbers, type and mode as"
    " for every other node; the reference writes the bare path and leaves the runtime to"
    " stat it"
)
INTENTIONAL_BY_KIND: tuple[tuple[str, frozenset[str], str], ...] = (
    ("nvidia", frozenset({"type"}), NODE_TYPE),
    ("vfio", frozenset({"type", "major", "minor", "fileMode", "permissions"}), VFIO_NUMBERS),
)


def intentional(root: dr.DriverRoot) -> tuple[Kept, ...]:
    """The table above for this node's device node paths."""
    paths = {
        "nvidia": [
            "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
            *(f"/dev/nvidia{g.minor}" for g in root.gpus),
        ],
        "vfio": [
            "/dev/vfio/vfio", "/dev/iommu",
            *(f"/dev/vfio/{g.iommu_group}" for g in root.gpus),
            *(f"/dev/vfio/devices/{g.vfio_dev}" for g in root.gpus),
        ],
    }  # fmt: skip
    return tuple(
        Kept("deviceNodes", path, fields, reason)
        for kind, fields, reason in INTENTIONAL_BY_KIND
        for path in paths[kind]
    )


def saved(reference: dict[str, Any]) -> dict[str, Any]:
    """The reference's spec as its ``spec.Save`` writes it: ``reference-cdi`` prints the
    spec before saving, and the toolkit's save transform sets the lowest cdiVersion the
    spec needs (pkg/nvcdi/spec setMinimumRequiredVersion: the CDI library's rules,
    which cdi.minimum_version mirrors). Remove once reference-cdi prints what Save
    writes."""
    return {**reference, "cdiVersion": cdi.minimum_version(reference)}


@dataclass(frozen=True)
class Node:
    """How the node is laid out for a case."""

    iommufd: bool = False  # the host has /dev/iommu and vfio cdevs
    host_driver_root: str = HOST_DRIVER_ROOT
    dev_in_driver_root: bool = False  # the chart's default: the host's / is the driver root


OPERATOR, IOMMUFD = Node(), Node(iommufd=True)
HOST_ROOT = Node(host_driver_root="/", dev_in_driver_root=True)
CASES: dict[str, tuple[ClaimCase, Node]] = {
    "gpu": (ClaimCase("gpu", "gpu", gpu=0), OPERATOR),
    "gpu-host-root": (ClaimCase("gpu-host-root", "gpu", gpu=0), HOST_ROOT),
    "mig": (ClaimCase("mig", "mig", gpu=4, mig=1), OPERATOR),
    "mps": (ClaimCase("mps", "gpu", gpu=1, mps=Path("mps")), OPERATOR),
    "vfio-legacy": (ClaimCase("vfio-legacy", "vfio", gpu=2), OPERATOR),
    "vfio-iommufd": (ClaimCase("vfio-iommufd", "vfio", gpu=2, vfio_prefer_iommufd=True), IOMMUFD),
    "vfio-prefer-iommufd-without-it": (
        ClaimCase("vfio-prefer-iommufd-without-it", "vfio", gpu=2, vfio_prefer_iommufd=True),
        OPERATOR,
    ),
}

#: Cases gpudra's generator does not match yet, with what differs. strict: a case
#: that starts matching fails until its entry is removed.
NOT_YET: dict[str, str] = {}


def _params() -> list[Any]:
    out = []
    for case_id in CASES:
        marks = []
        if case_id in NOT_YET:
            reason = f"gpudra's generator does not match yet: {NOT_YET[case_id]}"
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        out.append(pytest.param(case_id, id=case_id, marks=marks))
    return out


def _resolve(case: ClaimCase, base: Path) -> ClaimCase:
    """The case with its MPS directory made real under ``base``."""
    if case.mps is None:
        return case
    mps = base / case.mps
    for sub in ("pipe", "shm", "log"):
        (mps / sub).mkdir(parents=True)
    return ClaimCase(**{**case.__dict__, "mps": mps})


def _report(case_id: str, diffs: list[Difference]) -> str:
    lines = [f"{case_id}: {len(diffs)} difference(s) from the reference"]
    lines += [f"  {d}" for d in diffs]
    lines += [f"{case_id} in short: {summary(diffs)}"]
    return "\n".join(lines)


@pytest.mark.parametrize("case_id", _params())
def test_spec_matches_the_reference(
    case_id: str, controlplane_binary: Path, tmp_path: Path
) -> None:
    case, node = CASES[case_id]
    root = dr.build(
        tmp_path / "node", fleet="dgx-a100", iommufd=node.iommufd,
        dev_in_driver_root=node.dev_in_driver_root,
    )  # fmt: skip
    case = _resolve(case, tmp_path)
    reference = reference_spec(
        controlplane_binary, root, case, uid=UID, host_driver_root=node.host_driver_root,
        hook_path=HOOK,
    )  # fmt: skip
    ours = gpudra_spec(
        root, case, uid=UID, plugin_dir=tmp_path / "plugin",
        host_driver_root=node.host_driver_root, hook_path=HOOK,
    )  # fmt: skip
    kept = intentional(root)
    diffs = [d for d in compare(saved(reference), ours) if not any(k.covers(d) for k in kept)]
    print("\n" + _report(case_id, diffs))
    assert not diffs, _report(case_id, diffs)


def test_reference_specs_load_in_the_cdi_library(controlplane_binary: Path, tmp_path: Path) -> None:
    """The harness's output is a spec a container runtime accepts, for every case."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    root = dr.build(tmp_path / "node", fleet="dgx-a100", iommufd=True)
    names = []  # VFIO nodes are bare host paths (/dev/vfio/N), absent here: load those only
    for i, (case, _) in enumerate(CASES.values()):
        uid = f"{UID[:-2]}{i:02d}"
        spec = reference_spec(
            controlplane_binary, root, _resolve(case, tmp_path / case.id), uid=uid,
            host_driver_root=HOST_DRIVER_ROOT, hook_path=HOOK,
        )  # fmt: skip
        (spec_dir / f"k8s.gpu.nvidia.com-claim_{uid}.yaml").write_text(json.dumps(spec))
        if case.kind != "vfio":
            names += [f"{spec['kind']}={d['name']}" for d in spec["devices"]]
    injected = inject(controlplane_binary, spec_dir, names)
    assert {"/dev/nvidia0", "/dev/nvidia4", "/dev/nvidiactl"} <= injected.device_paths
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05" in injected.mounts
    assert injected.mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"].startswith(
        HOST_DRIVER_ROOT + "/"
    )


def test_reference_refuses_a_driver_root_without_libraries(
    controlplane_binary: Path, tmp_path: Path
) -> None:
    """What gpudra must match on bad input: no driver libraries is an error, not an empty spec."""
    root = dr.build(tmp_path / "node", fleet="l4x4", missing={"libraries"})
    with pytest.raises(AssertionError, match=r"reference-cdi exited 1: .*libcuda"):
        reference_spec(
            controlplane_binary, root, ClaimCase("gpu", "gpu", gpu=0), uid=UID,
            host_driver_root=HOST_DRIVER_ROOT, hook_path=HOOK,
        )  # fmt: skip


def test_reference_cdi_refuses_unknown_facts(controlplane_binary: Path, tmp_path: Path) -> None:
    """A facts file with a field the harness does not know is refused by name, not ignored."""
    root = dr.build(tmp_path / "node", fleet="l4x4", mig=False)
    facts = json.loads(root.facts_file.read_text())
    facts["gpus"][0]["numaNode"] = 3
    root.facts_file.write_text(json.dumps(facts))
    with pytest.raises(AssertionError, match='unknown field "numaNode"'):
        reference_spec(
            controlplane_binary, root, ClaimCase("gpu", "gpu", gpu=0), uid=UID,
            host_driver_root=HOST_DRIVER_ROOT, hook_path=HOOK,
        )  # fmt: skip
