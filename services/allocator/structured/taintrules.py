"""DeviceTaintRules applied to slices, as kube-scheduler's ResourceSlice tracker applies them.

The allocator never reads DeviceTaintRules itself: with DRADeviceTaintRules on
(DRADeviceTaints in 1.34, where rules belonged to that gate), the scheduler's
slice tracker (k8s.io/dynamic-resource-allocation/resourceslice/tracker,
``applyPatches``) appends each rule's taint to every device its selector
matches (driver, pool and device name, each only when given), and the
allocator sees those slices. Up to 1.36 a rule without ``deviceSelector``
taints every device; from 1.37 it taints none. The slices given are not
changed: patched copies are returned.
"""

from __future__ import annotations

import msgspec

from services.allocator.structured.features import Features
from services.core.kube.resource import DeviceTaintRule, ResourceSlice


def enabled(features: Features) -> bool:
    """Whether the scheduler of that release applies DeviceTaintRules."""
    return features.device_taint_rules if features.minor >= 35 else features.device_taints


def apply(
    slices: list[ResourceSlice],
    rules: list[DeviceTaintRule],
    features: Features,
    origins: dict[int, str] | None = None,
) -> list[ResourceSlice]:
    """The slices as the allocator sees them (the same objects where no rule applies);
    ``origins`` gets, per taint object a rule added, the rule's name (for explanations)."""
    if not rules or not enabled(features):
        return slices
    every = features.minor <= 36
    out = []
    for slice_ in slices:
        patched = slice_
        for rule in rules:
            selector = rule.spec.device_selector
            if selector is None and not every:
                continue
            if selector is not None and selector.driver is not None:
                if selector.driver != slice_.spec.driver:
                    continue
            if selector is not None and selector.pool is not None:
                if selector.pool != slice_.spec.pool.name:
                    continue
            for i, device in enumerate(slice_.spec.devices or []):
                if selector is not None and selector.device not in (None, device.name):
                    continue
                if patched is slice_:
                    patched = msgspec.structs.replace(
                        slice_,
                        spec=msgspec.structs.replace(
                            slice_.spec,
                            devices=[msgspec.structs.replace(d) for d in slice_.spec.devices or []],
                        ),
                    )
                target = (patched.spec.devices or [])[i]
                target.taints = [*(target.taints or []), rule.spec.taint]
                if origins is not None:
                    origins[id(rule.spec.taint)] = rule.metadata.name
        out.append(patched)
    return out
