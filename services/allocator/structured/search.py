"""Structured allocation of one claim on one node, as Kubernetes 1.34-1.37 do it.

This follows k8s.io/dynamic-resource-allocation/structured of the release
``features.minor`` names, and within it the implementation kube-scheduler
picks for those gates (stable, incubating or experimental;
:mod:`.variant` says which, and every behaviour that differs between them):
validate the requests (:mod:`.plan`), then a depth-first search over
requests -> devices with backtracking, devices in pool/slice/device order,
first full solution wins. :mod:`.draft` says what taking a device holds and how
backtracking gives it back; :mod:`.results` writes the AllocationResult.

Where upstream has quirks that change outcomes, they are kept on purpose so a
differential test against kube-scheduler agrees (each is commented where it
happens, with the releases that have it): counters a device took stay taken
within one search when a taint or a constraint then rejects it (up to 1.35);
``distinctAttribute`` remembers one value per request (up to 1.36); a claim
config naming several requests is copied once per request (up to 1.36);
every position of a request scans all devices, orderings rather than sets (up
to 1.35, and 1.36/1.37 stable). tests/e2e/allocator/test_differential_allocator.py
checks this against the upstream allocators of 1.37 and 1.35 on generated
scenarios. Deviations, also commented and listed in docs/differences.md:
pools are ordered by first appearance where upstream uses Go map order,
counters are keyed by driver and pool (upstream up to 1.36: pool name only),
an "All" subrequest after the first keeps its own selectors (upstream up to
1.35: the first subrequest's), a share of a device takes its counters (upstream
1.35: none).
"""

from __future__ import annotations

from collections.abc import Callable

from services.allocator.structured.draft import Draft
from services.allocator.structured.engine import Engine
from services.allocator.structured.errors import AllocationError
from services.allocator.structured.plan import MAX_DEVICES, Plan
from services.allocator.structured.pools import Node, NodeSelectorError
from services.allocator.structured.requests import ALL, RequestSpec
from services.allocator.structured.results import ResultBuilder
from services.allocator.structured.view import NodeView
from services.core.kube.resource import AllocationResult, DeviceClass, ResourceClaim


def allocate(engine: Engine, claim: ResourceClaim, node: Node | None) -> AllocationResult | None:
    """The allocation for ``claim`` on ``node``, None when it does not fit there.

    Raises :class:`AllocationError` when allocation must stop for this claim.
    Nothing is recorded: :meth:`.engine.Engine.commit` makes the devices busy.
    """
    try:
        view = engine.view(node)
    except NodeSelectorError as exc:
        raise AllocationError(f"gather pool information: {exc}") from exc
    return _Search(engine, claim, view).run()


class _MaxSizeExceeded(Exception):
    """errAllocationResultMaxSizeExceeded: more than 32 devices down this path."""


class _Search:
    """One Allocate call for one claim on one node (upstream's ``allocator`` struct)."""

    def __init__(self, engine: Engine, claim: ResourceClaim, view: NodeView) -> None:
        self.features = engine.features
        self.variant = engine.variant
        self.claim = claim
        self.view = view
        self.requests = (claim.spec.devices.requests if claim.spec.devices else None) or []
        self.plan = Plan(engine, claim, view)
        self.draft = Draft(engine, claim, self.plan.constraints)
        self.selected: dict[int, int] = {}

    def run(self) -> AllocationResult | None:
        try:
            done = self._allocate_one(0, 0, 0, False, 0)
        except _MaxSizeExceeded:
            done = False
        if not done:
            return None
        builder = ResultBuilder(self.claim, self.view.node, self.features, self.variant)
        return builder.build(self._chosen(), self.draft.picks)

    def _chosen(self) -> list[tuple[RequestSpec, DeviceClass]]:
        """Per request, the alternative the search settled on (the only one, or the
        subrequest that fitted)."""
        chosen = []
        for ri in range(len(self.requests)):
            data = self.plan.data[(ri, self.selected.get(ri, 0))]
            chosen.append((data.spec, data.device_class))
        return chosen

    def _allocate_one(self, ri: int, si: int, di: int, in_sub: bool, start: int) -> bool:
        if ri >= len(self.requests):
            return True
        data = self.plan.data[(ri, si)]
        if data.has_subrequests and not in_sub:
            all_exceeded = True
            for sub in range(len(self.requests[ri].first_available or [])):
                try:
                    done = self._allocate_one(ri, sub, 0, True, 0)
                except _MaxSizeExceeded:
                    continue
                all_exceeded = False
                if done:
                    self.selected[ri] = sub
                    return True
            if all_exceeded:
                raise _MaxSizeExceeded
            return False
        mode_all = data.spec.mode == ALL
        if mode_all and not data.all_devices:
            return False
        if di >= data.num_devices:
            return self._allocate_one(ri + 1, 0, 0, False, 0)
        if len(self.draft.picks) + data.num_devices - di > MAX_DEVICES:
            raise _MaxSizeExceeded
        if mode_all:
            undo = self.draft.take(data, data.all_devices[di], must=True)
            if undo is None:
                return False
            # Upstream up to 1.35 goes on with subrequest index 0 here, so an "All"
            # subrequest after the first continues with the first one's data (its
            # selectors and device list) and usually fails; we go on with this
            # subrequest, as 1.36 does (docs/differences.md, allocator deviations).
            return self._descend(undo, ri, si, di, in_sub, 0)
        # Up to 1.35 (and in 1.36/1.37's stable allocator) every device of the node
        # is tried for every position: the search visits orderings, not just sets,
        # which matters where the outcome depends on order (distinctAttribute
        # remembers one value per request; shared devices may be picked twice;
        # rejected devices keep counters). From 1.36 the incubating and
        # experimental allocators go on after the device just taken (startLocation).
        candidates, stop = self.view.candidates, self.view.stop
        for index in range(start if self.variant.combinations else 0, len(candidates) + 1):
            if stop is not None and index == stop[0]:
                raise AllocationError(stop[1])  # 1.34: an invalid pool stops the claim
            if index == len(candidates):
                break
            candidate = candidates[index]
            if data.rules.in_use(candidate, self.draft.allocating) is not None:
                continue
            if not data.selectable(candidate):
                continue
            if self.features.consumable_capacity and not self.draft.capacity_or_stop(
                data, candidate, "checking"
            ):
                continue
            undo = self.draft.take(data, candidate, must=False)
            if undo is None:
                continue
            if self._descend(undo, ri, si, di, in_sub, index + 1):
                return True
        return False

    def _descend(
        self, undo: Callable[[], None], ri: int, si: int, di: int, in_sub: bool, start: int
    ) -> bool:
        try:
            done = self._allocate_one(ri, si, di + 1, in_sub, start)
        except BaseException:
            undo()
            raise
        if not done:
            undo()
        return done
