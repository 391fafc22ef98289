"""Seeded breakages of generated scenarios: inputs the API server refuses.

Each mutation takes a generated scenario's objects (tests/helpers/scenarios.py)
and breaks one of them the way a hand-written manifest can be broken: a field
rule, a CEL selector, an unknown field, an attribute. Both ``gpudra allocate``
and ``reference-allocator`` must then refuse the input (exit 2) at the same
document, naming the same field with the same kind of error
(tests/e2e/test_differential_refusals.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Objects = list[dict[str, Any]]
Mutation = Callable[[random.Random, Objects], bool]  # False: nothing to break here


def _of(objects: Objects, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _exact_bodies(objects: Objects) -> list[dict[str, Any]]:
    return [
        r["exactly"]
        for c in _of(objects, "ResourceClaim")
        if "status" not in c
        for r in c["spec"]["devices"]["requests"]
        if "exactly" in r
    ]


def _devices(objects: Objects) -> list[dict[str, Any]]:
    return [d for s in _of(objects, "ResourceSlice") for d in s["spec"].get("devices") or []]


def _pick(rng: random.Random, items: list[Any]) -> Any | None:
    return rng.choice(items) if items else None


def negative_count(rng: random.Random, objects: Objects) -> bool:
    body = _pick(rng, [b for b in _exact_bodies(objects) if b.get("allocationMode") != "All"])
    if body is None:
        return False
    body["count"] = -rng.randint(1, 3)
    return True


def count_with_all(rng: random.Random, objects: Objects) -> bool:
    body = _pick(rng, _exact_bodies(objects))
    if body is None:
        return False
    body["allocationMode"], body["count"] = "All", rng.randint(1, 3)
    return True


def unknown_field(rng: random.Random, objects: Objects) -> bool:
    places = [*_exact_bodies(objects), *_devices(objects)]
    target = _pick(rng, places)
    if target is None:
        return False
    target[rng.choice(["bogus", "deviceClass", "Count", "attribute"])] = 1
    return True


_BAD_CEL = (
    "device.driver ==",
    "device.driver",
    "nodevice.driver == 'x'",
    "device.driver in ['a', 1]",
    "int('abc') == 1",
    "device.driver.matches('[')",
)


def bad_selector(rng: random.Random, objects: Objects) -> bool:
    holders = [b for b in _exact_bodies(objects)] + [c["spec"] for c in _of(objects, "DeviceClass")]
    target = _pick(rng, holders)
    if target is None:
        return False
    selectors = target.setdefault("selectors", [])
    selectors.insert(rng.randint(0, len(selectors)), {"cel": {"expression": rng.choice(_BAD_CEL)}})
    return True


def constraint_unknown_request(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, [c for c in _of(objects, "ResourceClaim") if "status" not in c])
    if claim is None:
        return False
    attribute = claim["spec"]["devices"]["requests"][0]["name"]
    claim["spec"]["devices"].setdefault("constraints", []).append(
        {"requests": [f"{attribute}-nope"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    )
    return True


def unqualified_match(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, [c for c in _of(objects, "ResourceClaim") if "status" not in c])
    if claim is None:
        return False
    claim["spec"]["devices"].setdefault("constraints", []).append({"matchAttribute": "pcieRoot"})
    return True


def two_values(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, [d for d in _devices(objects) if d.get("attributes")])
    if device is None:
        return False
    name = rng.choice(sorted(device["attributes"]))
    value = device["attributes"][name]
    value.update({"int": 7} if "int" not in value else {"string": "x"})
    return True


def bad_version(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.setdefault("attributes", {})["firmware"] = {
        "version": rng.choice(["1.2", "v1.2.3", "01.2.3"])
    }
    return True


def too_many_subrequests(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, [c for c in _of(objects, "ResourceClaim") if "status" not in c])
    if claim is None:
        return False
    request = claim["spec"]["devices"]["requests"][0]
    first = request.pop("exactly", None) or request["firstAvailable"][0]
    cls = first["deviceClassName"]
    request["firstAvailable"] = [{"name": f"s{i}", "deviceClassName": cls} for i in range(9)]
    return True


def bad_device_name(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["name"] = device["name"].upper()
    return True


MUTATIONS: tuple[Mutation, ...] = (
    negative_count,
    count_with_all,
    unknown_field,
    bad_selector,
    constraint_unknown_request,
    unqualified_match,
    two_values,
    bad_version,
    too_many_subrequests,
    bad_device_name,
)
