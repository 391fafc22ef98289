"""GPU model tables: what NVML reports for each GPU model the simulator knows.

One YAML file per model under ``profiles/`` holds the identity facts (product
name, brand, architecture, memory, PCI device id) and, for MIG-capable models,
the MIG profile table as NVIDIA publishes it. The simulator answers NVML
queries from these tables, so they must match what a real GPU says.
"""

from __future__ import annotations

import functools
from importlib import resources

import msgspec
import yaml

PROFILES_PACKAGE = "services.discovery.profiles"
MIB = 1024 * 1024


class ModelError(ValueError):
    """A model table that is missing or does not describe a valid GPU."""


class MigProfileSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One GPU-instance profile with its full-size compute instance."""

    name: str  # "1g.10gb", "1g.10gb+me"
    nvml_profile: int  # NVML_GPU_INSTANCE_PROFILE_* index
    id: int  # GI profile id (nvidia-smi "ID", device names)
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* index of the full CI
    slices: int  # compute slices
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    instances: int  # most instances of this profile at once
    size: int  # memory slices per placement
    starts: list[int]  # valid placement starts


class MigSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    memory_slices: int
    compute_slices: int
    profiles: list[MigProfileSpec]

    def by_id(self, profile_id: int) -> MigProfileSpec | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    def by_name(self, name: str) -> MigProfileSpec | None:
        return next((p for p in self.profiles if p.name == name), None)


class GpuModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    memory_mib: int
    pci_device_id: int
    addressable_memory_mib: int
    # NVML's answer: "ATS"/"HMM" on coherent platforms, "None" where the call is
    # supported but inactive (Hopper on x86 with driver 580), absent where unsupported.
    addressing_mode: str | None = None
    mig: MigSpec | None = None


def model_names() -> list[str]:
    return sorted(_all_models())


def get_model(name: str) -> GpuModel:
    models = _all_models()
    if name not in models:
        raise ModelError(f"unknown GPU model {name!r}; known models: {', '.join(sorted(models))}")
    return models[name]


@functools.cache
def _all_models() -> dict[str, GpuModel]:
    out: dict[str, GpuModel] = {}
    for entry in resources.files(PROFILES_PACKAGE).iterdir():
        if entry.name.endswith(".yaml"):
            model = parse_model(entry.name, entry.read_text())
            out[model.model] = model
    return out


def parse_model(source: str, text: str) -> GpuModel:
    """Decode and check one model table; errors name the file and the field."""
    try:
        model = msgspec.convert(yaml.safe_load(text), GpuModel)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ModelError(f"{source}: {exc}") from exc
    if model.mig is not None:
        _check_mig(source, model.mig)
    return model


def _check_mig(source: str, mig: MigSpec) -> None:
    seen_ids: set[int] = set()
    for p in mig.profiles:
        where = f"{source}: profile {p.name}"
        if p.id in seen_ids:
            raise ModelError(f"{where}: duplicate profile id {p.id}")
        seen_ids.add(p.id)
        if not 1 <= p.slices <= mig.compute_slices:
            raise ModelError(f"{where}: slices {p.slices} outside 1..{mig.compute_slices}")
        if not p.starts:
            raise ModelError(f"{where}: no placements")
        for start in p.starts:
            if start < 0 or start + p.size > mig.memory_slices or start % p.size:
                raise ModelError(
                    f"{where}: placement {start}:{p.size} does not fit "
                    f"{mig.memory_slices} memory slices aligned to its size"
                )
        if not 1 <= p.instances <= len(p.starts):
            raise ModelError(f"{where}: instances {p.instances} outside 1..{len(p.starts)}")
