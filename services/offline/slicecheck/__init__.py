"""Validate ResourceSlices against what the API server accepts.

The rules mirror kube-apiserver's ``ValidateResourceSlice`` for resource.k8s.io/v1
in the versions we support, so a slice that passes here is not rejected there.
1.34 and 1.35 differ in how partitionable devices are limited; 1.36 adds list-type
attributes (``ints``, ``bools``, ``strings``, ``versions``), which count as an
advanced feature for the device limit (``ResourceSliceMaxDevicesWithAdvancedFeatures``):

===============================  ==========================  ===========================
rule                             1.34                        1.35+
===============================  ==========================  ===========================
devices per slice                128                         128, 64 with taints/counters
                                                             (1.36+: or a list attribute)
taints per device                4                           16
counter sets                     <= 32 counters in all sets  <= 8 sets x 32 counters
devices and sharedCounters       may share a slice           never in the same slice
counters consumed per device     <= 32 in all entries        <= 2 entries x 32 counters
counters consumed per slice      <= 1024                     (no limit)
list-type attributes             none                        none (1.36+: <= 48 values
                                                             a device, lists not empty)
===============================  ==========================  ===========================

A 1.36 or 1.37 API server stores list-type attributes only with its alpha gate
DRAListTypeAttributes on; that is not visible in a slice, so lists pass here for
those versions (``gpudra slices`` says so when it prints one).

:func:`check_slice` checks one object (``slices``, ``device``, ``values``,
``counters``, ``names``, within the release's ``limits``); :func:`check_pool` also
checks what only a whole pool shows (``pool``: slice count, generation, unique names,
counter references). Each problem names the field path and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from services.core.kube.resource import ResourceSlice
from services.offline.slicecheck.limits import Limits
from services.offline.slicecheck.pool import check_pool_of
from services.offline.slicecheck.problem import Problem
from services.offline.slicecheck.slices import check_one

DEFAULT_KUBE_MINOR = 35

SliceLike = ResourceSlice | Mapping[str, Any]


def check_slice(obj: SliceLike, *, kube_minor: int = DEFAULT_KUBE_MINOR) -> list[Problem]:
    """Every problem of one ResourceSlice (object or plain JSON data)."""
    slice_, problems = _load(obj, "")
    if slice_ is None:
        return problems
    return check_one(slice_, Limits.for_minor(kube_minor))


def check_pool(objs: Sequence[SliceLike], *, kube_minor: int = DEFAULT_KUBE_MINOR) -> list[Problem]:
    """Check each slice, then the pool they form (count, generation, names, counters)."""
    limits = Limits.for_minor(kube_minor)
    loaded: list[tuple[str, ResourceSlice]] = []
    problems: list[Problem] = []
    for i, obj in enumerate(objs):
        where = f"slices[{i}]"
        slice_, errs = _load(obj, where + ".")
        problems += errs
        if slice_ is not None:
            problems += [Problem(f"{where}.{p.path}", p.message) for p in check_one(slice_, limits)]
            loaded.append((where, slice_))
    return problems + check_pool_of(loaded, limits)


def _load(obj: SliceLike, prefix: str) -> tuple[ResourceSlice | None, list[Problem]]:
    """The slice as an object, or why plain data is not one (at its field)."""
    if isinstance(obj, ResourceSlice):
        return obj, []
    try:
        return msgspec.convert(obj, ResourceSlice), []
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        path = where.rstrip("`").lstrip(".") or "$"
        return None, [Problem(prefix + path, f"not a ResourceSlice: {message}")]
