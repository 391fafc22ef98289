"""The allocation result built from the devices the search picked: one result per
device, the configs of the classes and the claim for the chosen requests, and the
node selector the pod must then land on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.allocator.structured.errors import AllocationError
from services.allocator.structured.features import Features
from services.allocator.structured.pools import Node
from services.allocator.structured.requests import RequestSpec
from services.allocator.structured.variant import Variant
from services.allocator.structured.view import Candidate
from services.core.kube.resource import (
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceAllocationResult,
    DeviceClass,
    DeviceRequestAllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)

#: Per request of the claim, in order: the alternative chosen and its class.
Chosen = Sequence[tuple[RequestSpec, DeviceClass]]


@dataclass(slots=True)
class Pick:
    """One device the search took for one request (upstream's internalDeviceResult)."""

    spec: RequestSpec
    candidate: Candidate
    share_id: str | None
    consumed: dict[str, str] | None


class ResultBuilder:
    """Writes the AllocationResult of one claim on one node, as upstream's Allocate ends."""

    def __init__(
        self, claim: ResourceClaim, node: Node | None, features: Features, variant: Variant
    ) -> None:
        self.claim = claim
        self.requests = (claim.spec.devices.requests if claim.spec.devices else None) or []
        self.node = node
        self.features = features
        self.variant = variant

    def build(self, chosen: Chosen, picks: Sequence[Pick]) -> AllocationResult:
        """Raises :class:`AllocationError` for a node selector it cannot merge."""
        results = [self._device_result(p) for p in picks]
        return AllocationResult(
            devices=DeviceAllocationResult(results=results, config=self._configs(chosen) or None),
            node_selector=self._node_selector(picks),
        )

    def _device_result(self, pick: Pick) -> DeviceRequestAllocationResult:
        spec = pick.spec
        candidate = pick.candidate
        out = DeviceRequestAllocationResult(
            request=spec.result_name,
            driver=candidate.id[0],
            pool=candidate.id[1],
            device=candidate.id[2],
            admin_access=True if spec.admin else None,
            tolerations=(list(spec.tolerations) or None)
            if self.variant.tolerations_in_results
            else None,
            share_id=pick.share_id,
            consumed_capacity=pick.consumed,
        )
        if self.features.binding_and_status:
            out.binding_conditions = candidate.device.binding_conditions
            out.binding_failure_conditions = candidate.device.binding_failure_conditions
        if self.variant.channel == "experimental" and self.variant.minor >= 37:
            out.skip_node_operations = candidate.slice.spec.skip_node_operations
        return out

    def _configs(self, chosen: Chosen) -> list[DeviceAllocationConfiguration]:
        configs: list[DeviceAllocationConfiguration] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        for spec, device_class in chosen:
            name = device_class.metadata.name
            if name in class_ranges:
                first, end = class_ranges[name]
                for i in range(first, end):
                    configs[i].requests = [*(configs[i].requests or []), spec.result_name]
                continue
            first = len(configs)
            for class_config in device_class.spec.config or []:
                configs.append(
                    DeviceAllocationConfiguration(
                        source="FromClass",
                        requests=[spec.result_name],
                        opaque=class_config.opaque,
                    )
                )
            class_ranges[name] = (first, len(configs))
        devices = self.claim.spec.devices
        once = self.variant.claim_config_once
        for config in (devices.config if devices else None) or []:
            from_claim = DeviceAllocationConfiguration(
                source="FromClaim", requests=config.requests, opaque=config.opaque
            )
            if not config.requests:
                configs.append(from_claim)
                continue
            # Up to 1.36 upstream appends the config once per request it names
            # (``continue``); 1.37 once (``break``).
            for request, (spec, _) in zip(self.requests, chosen, strict=True):
                if request.name in config.requests or (
                    spec.parent and spec.result_name in config.requests
                ):
                    configs.append(from_claim)
                    if once:
                        break
        if once:
            for made in configs:
                if made.requests and self._names_every_request(chosen, made.requests):
                    made.requests = None  # "empty means all"
        return configs

    def _names_every_request(self, chosen: Chosen, names: list[str]) -> bool:
        for request, (spec, _) in zip(self.requests, chosen, strict=True):
            if request.name in names:
                continue
            if spec.parent and spec.result_name in names:
                continue
            return False
        return True

    def _node_selector(self, picks: Sequence[Pick]) -> NodeSelector | None:
        fields: list[NodeSelectorRequirement] = []
        expressions: list[NodeSelectorRequirement] = []
        for pick in picks:
            candidate = pick.candidate
            spec = candidate.slice.spec
            if spec.per_device_node_selection:
                node_name, selector = candidate.device.node_name, candidate.device.node_selector
            else:
                node_name, selector = spec.node_name, spec.node_selector
            if node_name or (self.features.binding_and_status and candidate.device.binds_to_node):
                target = self.node.name if self.node else node_name
                return NodeSelector(
                    node_selector_terms=[
                        NodeSelectorTerm(
                            match_fields=[
                                NodeSelectorRequirement(
                                    key="metadata.name", operator="In", values=[target or ""]
                                )
                            ]
                        )
                    ]
                )
            if selector is None or not selector.node_selector_terms:
                continue
            if len(selector.node_selector_terms) > 1:
                raise AllocationError(
                    f"create NodeSelector for claim {self.claim.metadata.name}: unsupported "
                    f"ResourceSlice.NodeSelector with {len(selector.node_selector_terms)} terms"
                )
            term = selector.node_selector_terms[0]
            _merge(term.match_fields or [], fields)
            _merge(term.match_expressions or [], expressions)
        if not fields and not expressions:
            return None
        return NodeSelector(
            node_selector_terms=[
                NodeSelectorTerm(match_fields=fields or None, match_expressions=expressions or None)
            ]
        )


def _merge(new: list[NodeSelectorRequirement], into: list[NodeSelectorRequirement]) -> None:
    for req in new:
        if not any(
            r.key == req.key
            and r.operator == req.operator
            and set(r.values or []) == set(req.values or [])
            for r in into
        ):
            into.append(req)
