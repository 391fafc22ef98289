"""The webhook admits exactly what prepare accepts: 2,000 generated configs, both callers.

Each generated config (valid ones mutated: wrong types, unknown keys and values,
missing fields, other kinds, every gate combination) goes through the webhook's
``admit`` as a claim's config and through the preparer's ``configs.resolve`` as
that claim's allocation config for one GPU. A config prepare refuses must be
denied with prepare's message; one prepare accepts must be admitted. The only
refusals the webhook cannot foresee are those that need the allocation (a config
naming a request whose device is of another type), and they are counted apart.
"""

from __future__ import annotations

import json
import random
from typing import Any

from services.core.kube.resource import DeviceRequestAllocationResult
from services.core.model import configs
from services.core.model import featuregates as fg
from services.webhook import admit, review
from tests.helpers import badconfigs
from tests.helpers.preparer import opaque

API = badconfigs.API
GATE_SETS = [
    fg.parse(""),
    fg.parse("MPSSupport=true"),
    fg.parse("TimeSlicingSettings=true,PassthroughSupport=true"),
    fg.parse(badconfigs.GATES),
]
VALUES: list[Any] = [None, 0, -1, 50, 101, 150, "", "x", "Default", "Long", "Forever", "MPS",
                     "TimeSlicing", "Spatial", "1Gi", "0", "lots", "512Ki", True, [], {}, 2.5,
                     "LegacyOnly", "PreferIommuFD", "Bogus"]  # fmt: skip
KEYS = ["sharing", "strategy", "timeSlicingConfig", "mpsConfig", "interval", "iommu",
        "defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "backendPolicy",
        "defaultPerDevicePinnedMemoryLimit", "multiUser", "enableAPIDevice", "bogus"]  # fmt: skip
SEEDS: list[dict[str, Any]] = [
    {"apiVersion": API, "kind": "GpuConfig"},
    {"apiVersion": API, "kind": "GpuConfig",
     "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
    {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi",
        "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"}}}},
    {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}},
    {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "PreferIommuFD"}},
]  # fmt: skip


def mutate(rng: random.Random, node: Any, depth: int = 0) -> Any:
    if not isinstance(node, dict) or (depth and rng.random() < 0.2):
        return rng.choice(VALUES) if rng.random() < 0.5 else node
    out = dict(node)
    for key in list(out):
        roll = rng.random()
        if roll < 0.1 and key not in ("apiVersion",):
            del out[key]
        elif roll < 0.5:
            out[key] = mutate(rng, out[key], depth + 1)
    if rng.random() < 0.2:
        out[rng.choice(KEYS)] = rng.choice(VALUES)
    if depth == 0 and rng.random() < 0.05:
        out["apiVersion"] = rng.choice(["resource.nvidia.com/v1", API, 3])
    if depth == 0 and rng.random() < 0.1:
        out["kind"] = rng.choice(["GpuConfig", "MigDeviceConfig", "VfioDeviceConfig", "TpuConfig"])
    return out


def webhook_verdict(params: Any, gates: fg.FeatureGates) -> admit.Verdict:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "CREATE",
            "namespace": "ns",
            "name": "c",
            "object": badconfigs.claim("ns", "c", params),
        },
    }
    return admit.admit(review.parse(json.dumps(body).encode()), gates)


def prepare_error(params: Any, gates: fg.FeatureGates) -> str:
    result = DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="n",
                                           device="gpu-0")  # fmt: skip
    try:
        configs.resolve([opaque(params, requests=["gpu"])], [result], {"gpu-0": "gpu"}, gates)
    except configs.ConfigError as exc:
        return str(exc)
    return ""


def test_admission_and_prepare_agree_on_generated_configs() -> None:
    rng = random.Random(15)
    seen = {"admitted": 0, "denied": 0, "needs the allocation": 0}
    for _ in range(2000):
        params = mutate(rng, rng.choice(SEEDS))
        gates = rng.choice(GATE_SETS)
        verdict = webhook_verdict(params, gates)
        error = prepare_error(params, gates)
        if error and "cannot apply to device" in error:
            seen["needs the allocation"] += 1  # a MigDeviceConfig/VfioDeviceConfig for a GPU
            continue
        if error:
            assert not verdict.allowed, (params, gates.spec(), error)
            assert error in verdict.message, (verdict.message, error)
            seen["denied"] += 1
        else:
            assert verdict.allowed, (params, gates.spec(), verdict.message)
            seen["admitted"] += 1
    assert all(seen.values()), seen  # every branch was exercised
