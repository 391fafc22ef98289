"""Why a claim is not allocated: per request, how many devices each cause removed.

The search itself only says "no solution". To explain, every device a node can
see is classified once per request, by the first check it fails, in the order
the allocator applies them: pool usable, not in use, DeviceClass selectors,
request selectors (or a CEL error), per-device node, binding conditions,
consumable capacity, skipped node operations the node does not declare
(1.37), counters and their compatibility groups (1.37), taints (a device's own
or a DeviceTaintRule's). Devices that pass everything are *candidates*; when
every request has enough candidates and the claim still does not fit, the
claim-level constraints (with what they compare: values, or from 1.37 with
DRAListTypeAttributes sets of values, and derived attributes) or the
32-device limit are named.
A CEL "no such key" error comes with a "did you mean" drawn from the attribute
names and domains the devices actually have.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.allocator.cel.selector import CelError, Reference, split_name
from services.allocator.structured.engine import Engine
from services.allocator.structured.errors import claim_label, device_label
from services.allocator.structured.plan import MAX_DEVICES
from services.allocator.structured.pools import Node, NodeSelectorError
from services.allocator.structured.requests import ALL, RequestSpec, alternatives
from services.allocator.structured.rules import DeviceRules
from services.allocator.structured.view import Candidate
from services.core.kube.resource import ResourceClaim


@dataclass(slots=True)
class Cause:
    cause: str  # stable code, e.g. "class-selector-false"
    count: int  # devices (or pools, for pool causes) it removed
    message: str
    suggestion: str | None = None


@dataclass(slots=True)
class RequestExplanation:
    request: str
    needed: int | None  # None for allocationMode All
    candidates: int
    causes: list[Cause] = field(default_factory=list)


@dataclass(slots=True)
class Explanation:
    nodes: int
    requests: list[RequestExplanation] = field(default_factory=list)
    claim: list[Cause] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per cause, for people."""
        out: list[str] = []
        for req in self.requests:
            needed = "all" if req.needed is None else str(req.needed)
            out.append(
                f"request {req.request}: needs {needed}, {req.candidates} candidate device(s) "
                f"on {self.nodes} node(s)"
            )
            for c in req.causes:
                hint = f" (did you mean {c.suggestion!r}?)" if c.suggestion else ""
                out.append(f"  - {c.count} device(s): {c.message}{hint}")
        for c in self.claim:
            hint = f" (did you mean {c.suggestion!r}?)" if c.suggestion else ""
            out.append(f"claim: {c.message}{hint}")
        return out


class _Tally:
    """Unique devices per (cause, message), across nodes (a device every node sees counts
    once), each with how many nodes saw it so that a node's part can be taken back."""

    def __init__(self) -> None:
        self.devices: dict[tuple[str, str, str | None], Counter[object]] = {}
        self.candidates: Counter[object] = Counter()

    def add(self, code: str, message: str, key: object, suggestion: str | None = None) -> None:
        self.devices.setdefault((code, message, suggestion), Counter())[key] += 1

    def merge(self, other: _Tally, sign: int) -> None:
        for cause, keys in other.devices.items():
            mine = self.devices.setdefault(cause, Counter())
            _shift(mine, keys, sign)
            if not mine:
                del self.devices[cause]
        _shift(self.candidates, other.candidates, sign)

    def causes(self) -> list[Cause]:
        """Most devices first; ties by code and message, whatever order nodes came in."""
        ranked = sorted(self.devices.items(), key=lambda kv: (-len(kv[1]), kv[0][0], kv[0][1]))
        return [Cause(code, len(keys), msg, hint) for (code, msg, hint), keys in ranked]


def _shift(into: dict[Any, int], counts: Mapping[Any, int], sign: int) -> None:
    """Add (sign 1) or take back (sign -1) ``counts``; what reaches zero goes."""
    for key, n in counts.items():
        left = into.get(key, 0) + sign * n
        if left:
            into[key] = left
        else:
            into.pop(key, None)


def _distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def did_you_mean(word: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``word``: same letters ignoring case, else a small edit."""
    options = sorted(set(known) - {word})
    for option in options:
        if option.lower() == word.lower():
            return option
    best = min(options, key=lambda o: _distance(word, o), default=None)
    if best is not None and _distance(word, best) <= max(2, len(word) // 3):
        return best
    return None


def _missing_key(message: str) -> str | None:
    match = re.search(r"no such key: (.+)$", message)
    return match.group(1) if match else None


def suggest(message: str, references: list[Reference], candidates: list[Candidate]) -> str | None:
    """For "no such key: x": the attribute or domain the author probably meant."""
    key = _missing_key(message)
    if key is None:
        return None
    names: dict[tuple[str, str], set[str]] = {}
    for candidate in candidates:
        device = candidate.device
        for map_name, entries in (("attributes", device.attributes), ("capacity", device.capacity)):
            for qualified in entries or {}:
                domain, ident = split_name(qualified, candidate.pool.driver)
                names.setdefault((map_name, domain), set()).add(ident)
    for ref in references:
        if ref.name != key:
            continue
        domains = {d for (m, d) in names if m == ref.map_name}
        if ref.domain is not None and ref.domain not in domains:
            return did_you_mean(ref.domain, domains)
        return did_you_mean(key, names.get((ref.map_name, ref.domain or ""), set()))
    every = set().union(*names.values()) if names else set()
    return did_you_mean(key, every)


class Explainer:
    """Builds an :class:`Explanation` for one claim over the nodes it was tried on."""

    def __init__(self, engine: Engine, claim: ResourceClaim) -> None:
        self.engine = engine
        self.claim = claim
        self.requests = (claim.spec.devices.requests if claim.spec.devices else None) or []
        self.tallies: dict[str, _Tally] = {}
        self.specs: dict[str, RequestSpec] = {}
        self.claim_causes: dict[tuple[str, str, str | None], int] = {}
        self.seen: dict[tuple[str, str, str], Candidate] = {}
        self.nodes = 0

    def node(self, node: Node | None) -> None:
        """Classify every device ``node`` sees, for every request."""
        self.nodes += 1
        try:
            view = self.engine.view(node)
        except NodeSelectorError as exc:
            self._claim_cause("node-selector-invalid", str(exc))
            return
        for pool in view.pools:
            if pool.incomplete:
                self._claim_cause(
                    "pool-incomplete", f"resource pool {pool.label()} is incomplete (being updated)"
                )
            elif pool.invalid:
                self._claim_cause(
                    "pool-invalid", f"resource pool {pool.label()} is invalid: {pool.invalid}"
                )
        for candidate in view.candidates:
            self.seen.setdefault(candidate.id, candidate)
        for request in self.requests:
            for spec in alternatives(request):
                self._classify(spec, view.candidates, node)

    def part(self, node: Node | None) -> Explainer:
        """What ``node`` adds to this explanation, on its own (merged with :meth:`merge`)."""
        part = Explainer(self.engine, self.claim)
        part.node(node)
        return part

    def merge(self, part: Explainer, sign: int = 1) -> None:
        """Add a node's :meth:`part`, or (``sign`` -1) take one back that no longer holds."""
        self.nodes += sign * part.nodes
        for name, tally in part.tallies.items():
            self.tallies.setdefault(name, _Tally()).merge(tally, sign)
        self.specs.update(part.specs)
        _shift(self.claim_causes, part.claim_causes, sign)
        self.seen.update(part.seen)

    def _claim_cause(self, code: str, message: str, suggestion: str | None = None) -> None:
        key = (code, message, suggestion)
        self.claim_causes[key] = self.claim_causes.get(key, 0) + 1

    def _classify(self, spec: RequestSpec, candidates: list[Candidate], node: Node | None) -> None:
        tally = self.tallies.setdefault(spec.result_name, _Tally())
        self.specs[spec.result_name] = spec
        device_class = self.engine.classes.get(spec.class_name)
        if device_class is None:
            self._claim_cause(
                "class-missing",
                f"request {spec.result_name}: DeviceClass {spec.class_name!r} does not exist",
            )
            return
        rules = DeviceRules(self.engine, spec, device_class, node, claim_label(self.claim))
        for candidate in candidates:
            rejection = rules.first(candidate)
            if rejection is None:
                tally.candidates[candidate.id] += 1
                continue
            hint = None
            if rejection.cel_error is not None and rejection.selector is not None:
                hint = suggest(
                    rejection.cel_error.message, rejection.selector.references, candidates
                )
            tally.add(rejection.code, rejection.message, candidate.id, hint)
            if (
                spec.mode == ALL
                and rejection.code == "capacity-exhausted"
                and self.engine.variant.all_mode_static_capacity
            ):
                # 1.37: "All" keeps a matching device whose capacity is in use, so the
                # request cannot be met while it is.
                self._claim_cause(
                    "all-capacity-in-use",
                    f"request {spec.result_name} asks for all matching devices, and "
                    f"{device_label(candidate.id)} has too little capacity left",
                )

    def explanation(self) -> Explanation:
        out = Explanation(nodes=self.nodes)
        short = False
        total = 0
        for name, tally in self.tallies.items():
            spec = self.specs[name]
            needed = None if spec.mode == ALL else spec.count
            count = len(tally.candidates)
            if (needed is None and count == 0) or (needed is not None and count < needed):
                short = True
            total += count if needed is None else needed
            out.requests.append(RequestExplanation(name, needed, count, tally.causes()))
        causes = sorted(self.claim_causes.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        claim = [Cause(c, n, m, h) for (c, m, h), n in causes]
        if not short and self.tallies:
            claim.extend(self._combination_causes(total))
        out.claim = claim
        return out

    def _candidates_use_groups(self) -> bool:
        ids = set().union(*(t.candidates for t in self.tallies.values()))
        return any(_uses_groups(self.seen[i]) for i in ids if i in self.seen)

    def _combination_causes(self, total: int) -> list[Cause]:
        causes: list[Cause] = []
        if total > MAX_DEVICES:
            causes.append(
                Cause("too-many-devices", 1, f"the claim needs more than {MAX_DEVICES} devices")
            )
        devices = self.claim.spec.devices
        features, variant = self.engine.features, self.engine.variant
        sets = variant.list_constraints and features.list_type_attributes
        derived = {d.name for spec in self.specs.values() for d in spec.derived_attributes}
        for constraint in (devices.constraints if devices else None) or []:
            attribute = constraint.match_attribute or constraint.distinct_attribute
            kind = "matchAttribute" if constraint.match_attribute else "distinctAttribute"
            scope = ", ".join(constraint.requests or []) or "all requests"
            if constraint.match_attribute:
                how = "no value common to all (attribute lists compared as sets)" if sets else ""
            else:
                how = "values not pairwise disjoint (as sets)" if sets else ""
            origin = " (a derived attribute of the request)" if attribute in derived else ""
            detail = f": {how}" if how else ""
            causes.append(
                Cause(
                    "constraint-unsatisfiable",
                    1,
                    f"{kind} {attribute}{origin} over {scope} cannot be satisfied by the "
                    f"candidates{detail}",
                )
            )
        if not causes and features.compatibility_groups and self._candidates_use_groups():
            causes.append(
                Cause(
                    "compatibility-groups",
                    1,
                    "the candidates draw on shared counters whose compatibility groups do not "
                    "fit together (devices on one counter set must share a group, or all "
                    "have none)",
                )
            )
        if not causes:
            causes.append(
                Cause(
                    "combination",
                    1,
                    "each request has candidates, but no combination fits together "
                    "(shared counters or the same devices)",
                )
            )
        return causes


def _uses_groups(candidate: Candidate) -> bool:
    return any(c.compatibility_groups for c in candidate.device.consumes_counters or [])


def error_explanation(
    engine: Engine, claim: ResourceClaim, message: str, node: Node | None
) -> Explanation:
    """An allocation error (CEL and the like) as an explanation, with a suggestion if any."""
    explainer = Explainer(engine, claim)
    try:
        explainer.node(node)
    except (CelError, ValueError):
        pass
    out = explainer.explanation()
    hint = None
    if _missing_key(message):
        try:
            candidates = engine.view(node).candidates
        except NodeSelectorError:
            candidates = []
        refs = [
            ref
            for request in explainer.specs.values()
            for selector in request.selectors
            if selector.cel
            for ref in engine.env.compile(selector.cel.expression).references
        ]
        for device_class in engine.classes.values():
            for selector in device_class.spec.selectors or []:
                if selector.cel:
                    refs += engine.env.compile(selector.cel.expression).references
        hint = suggest(message, refs, candidates)
    out.claim.insert(0, Cause("error", 1, message, hint))
    return out


__all__ = ["Cause", "Explainer", "Explanation", "device_label", "did_you_mean", "error_explanation"]
