"""The reference's side of the differential CDI test, and the edit-by-edit comparison.

:func:`reference_spec` runs ``controlplane reference-cdi`` (NVIDIA's nvcdi, as
the reference driver calls it) for a :class:`ClaimCase` on a fake driver
root; :func:`compare` lines up two specs edit by edit (env, device nodes,
mounts, hooks; common and per device) and returns every difference.

Normalisation is ordering: lists are sorted, and the ``--link`` pairs of a
``create-symlinks`` hook are sorted. Besides that, two spellings of one value
count as one, because the CDI library (and so every runtime) reads them the
same: a device node's absent ``major``/``minor`` is 0 (Go's ``omitempty``
drops a minor of 0), and a ``hostPath`` equal to ``path`` is an absent one
(the toolkit itself clears it for that reason). No other field is dropped or
rewritten.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from services.core.model.nvidia import gpu_device_name, vfio_device_name
from services.local.driverroot import DriverRoot


@dataclass(frozen=True)
class ClaimCase:
    """One allocated device and its config: what both generators are asked for."""

    id: str
    kind: Literal["gpu", "mig", "vfio"]
    gpu: int  # index into DriverRoot.gpus
    mig: int = 0  # index into that GPU's MIG devices
    mps: Path | None = None  # MPS daemon directory (pipe/, shm/ under it): MPS sharing
    vfio_api_device: bool = True
    vfio_prefer_iommufd: bool = False

    def device_name(self, root: DriverRoot) -> str:
        gpu = root.gpu(self.gpu)
        if self.kind == "vfio":
            return vfio_device_name(self.gpu)
        if self.kind == "mig":
            return gpu.migs[self.mig].device_name
        return gpu_device_name(gpu.minor)

    def reference_device(self, root: DriverRoot) -> str:
        """``--device KIND:NAME:ID`` for reference-cdi."""
        gpu = root.gpu(self.gpu)
        ids = {"gpu": gpu.uuid, "vfio": gpu.pci_bus_id}
        ident = gpu.migs[self.mig].uuid if self.kind == "mig" else ids[self.kind]
        return f"{self.kind}:{self.device_name(root)}:{ident}"


def reference_spec(
    controlplane: Path,
    root: DriverRoot,
    case: ClaimCase,
    *,
    uid: str,
    host_driver_root: str,
    hook_path: str,
) -> dict[str, Any]:
    """The reference driver's spec for ``case``; fails with reference-cdi's own words."""
    argv = [
        str(controlplane), "reference-cdi",
        "--facts", str(root.facts_file),
        "--driver-root", str(root.driver_root),
        "--target-driver-root", host_driver_root,
        "--dev-root", str(root.dev_root),
        "--nvidia-cdi-hook-path", hook_path,
        "--proc", str(root.proc),
        "--sysfs", str(root.sysfs),
        "--claim-uid", uid,
        "--device", case.reference_device(root),
    ]  # fmt: skip
    if case.mps is not None:
        argv += ["--mps-pipe-dir", str(case.mps / "pipe"), "--mps-shm-dir", str(case.mps / "shm")]
    if case.kind == "vfio":
        argv += ["--vfio-api-device"] if case.vfio_api_device else []
        argv += ["--vfio-prefer-iommufd"] if case.vfio_prefer_iommufd else []
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"reference-cdi exited {proc.returncode}: {proc.stderr.strip()}")
    spec: dict[str, Any] = json.loads(proc.stdout)
    return spec


# ---------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Difference:
    """One edit that is not the same: where, which, and each side's value (None: absent)."""

    where: str  # "spec", "common", "device <name>"
    section: str  # "cdiVersion", "env", "deviceNodes", "mounts", "hooks"
    key: str  # the edit's identity: env name, node path, container path, hook kind
    reference: Any
    gpudra: Any

    def __str__(self) -> str:
        if self.gpudra is None:
            return (
                f"{self.where} {self.section} {self.key}: only in the reference: {self.reference}"
            )
        if self.reference is None:
            return f"{self.where} {self.section} {self.key}: only in gpudra: {self.gpudra}"
        return (
            f"{self.where} {self.section} {self.key}:\n"
            f"    reference: {self.reference}\n    gpudra:    {self.gpudra}"
        )


@dataclass(frozen=True)
class Kept:
    """A difference gpudra keeps on purpose: this edit may differ in these fields, for a reason.

    ``fields`` empty: the edit may be missing on one side altogether. Otherwise
    only a changed edit whose changed fields all lie in ``fields`` is covered,
    so a new difference in the same edit still fails.
    """

    section: str
    key: str
    fields: frozenset[str]
    reason: str

    def covers(self, d: Difference) -> bool:
        if (d.section, d.key) != (self.section, self.key):
            return False
        if not self.fields:
            return d.reference is None or d.gpudra is None
        if not (isinstance(d.reference, dict) and isinstance(d.gpudra, dict)):
            return False
        changed = {
            k for k in d.reference.keys() | d.gpudra.keys() if d.reference.get(k) != d.gpudra.get(k)
        }
        return changed <= self.fields


def _hook_key(hook: dict[str, Any]) -> str:
    args = hook.get("args", [])
    return f"{hook.get('hookName')} {args[1] if len(args) > 1 else hook.get('path')}"


def _sorted_links(args: list[str]) -> list[str]:
    """create-symlinks' ``--link A::B`` pairs in a fixed order (their order means nothing)."""
    if len(args) < 2 or args[1] != "create-symlinks" or len(args) % 2:
        return args  # not a well-formed create-symlinks: compared as it is
    head, rest = args[:2], args[2:]
    pairs = sorted(zip(rest[::2], rest[1::2], strict=True))
    return head + [x for pair in pairs for x in pair]


def _node(node: dict[str, Any]) -> dict[str, Any]:
    """A device node with the library's equivalent spellings made one (see the module doc)."""
    out = {k: v for k, v in node.items() if not (k == "hostPath" and v == node.get("path"))}
    for number in ("major", "minor"):
        out.setdefault(number, 0)
    return out


def _keyed(section: str, items: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if section == "env":
            key, value = item.split("=", 1)[0], item
        elif section == "deviceNodes":
            key, value = item["path"], _node(item)
        elif section == "mounts":
            key, value = item["containerPath"], item
        else:
            key, value = _hook_key(item), {**item, "args": _sorted_links(item.get("args", []))}
        # Two edits with one identity (e.g. two create-symlinks hooks): keep them all, sorted.
        if key in out:
            merged = out[key] if isinstance(out[key], list) else [out[key]]
            out[key] = sorted([*merged, value], key=json.dumps)
        else:
            out[key] = value
    return out


SECTIONS = ("env", "deviceNodes", "mounts", "hooks")
OTHER_EDITS = ("additionalGids", "intelRdt")


def _compare_edits(where: str, ref: dict[str, Any], ours: dict[str, Any]) -> list[Difference]:
    diffs = []
    for section in SECTIONS:
        a, b = _keyed(section, ref.get(section, [])), _keyed(section, ours.get(section, []))
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                diffs.append(Difference(where, section, key, a.get(key), b.get(key)))
    for section in OTHER_EDITS:
        if ref.get(section) != ours.get(section):
            diffs.append(Difference(where, section, "", ref.get(section), ours.get(section)))
    return diffs


def compare(reference: dict[str, Any], gpudra: dict[str, Any]) -> list[Difference]:
    """Every difference between the two specs, common edits and device by device."""
    diffs = []
    for field in ("cdiVersion", "kind"):
        if reference.get(field) != gpudra.get(field):
            diffs.append(Difference("spec", field, "", reference.get(field), gpudra.get(field)))
    diffs += _compare_edits(
        "common", reference.get("containerEdits", {}), gpudra.get("containerEdits", {})
    )
    ref_devices = {d["name"]: d for d in reference.get("devices", [])}
    our_devices = {d["name"]: d for d in gpudra.get("devices", [])}
    for name in sorted(ref_devices.keys() | our_devices.keys()):
        if name not in ref_devices or name not in our_devices:
            diffs.append(
                Difference("spec", "devices", name, name in ref_devices, name in our_devices)
            )
            continue
        ref, ours = ref_devices[name], our_devices[name]
        diffs += _compare_edits(
            f"device {name}", ref.get("containerEdits", {}), ours.get("containerEdits", {})
        )
        if ref.get("annotations") != ours.get("annotations"):
            diffs.append(
                Difference(
                    f"device {name}",
                    "annotations",
                    "",
                    ref.get("annotations"),
                    ours.get("annotations"),
                )
            )
    return diffs


def summary(diffs: Iterable[Difference]) -> str:
    """One line per kind of difference, without paths that change from run to run."""
    groups: dict[str, list[str]] = {}
    for d in diffs:
        where = "device" if d.where.startswith("device") else d.where
        if d.gpudra is None:
            what = "only in the reference"
        elif d.reference is None:
            what = "only in gpudra"
        elif isinstance(d.reference, dict) and isinstance(d.gpudra, dict):
            fields = sorted(
                k for k in d.reference.keys() | d.gpudra.keys()
                if d.reference.get(k) != d.gpudra.get(k)
            )  # fmt: skip
            what = f"differ in {', '.join(fields)}"
        else:
            what = f"{d.reference} in the reference, {d.gpudra} in gpudra"
        groups.setdefault(f"{where} {d.section} {what}", []).append(d.key)
    lines = []
    for label, keys in groups.items():
        named = [k for k in keys if k]
        sample = f" ({', '.join(named[:3])}{', ...' if len(named) > 3 else ''})" if named else ""
        lines.append(f"{len(keys)} x {label}{sample}" if named else label)
    return "; ".join(lines)
