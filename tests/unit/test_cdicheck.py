"""The CDI loader's rules in cdicheck: each one caught on a spec that breaks it.

The rules mirror tags.cncf.io/container-device-interface v1.1 (what containerd
and CRI-O load specs with); e2e loads specs with that library itself: these cases in
tests/e2e/test_cdi_library.py, every spec the preparer writes for the examples in
tests/e2e/test_stack.py. Nothing here reads a file outside the repository (a clone
has nothing beside it).
"""

from __future__ import annotations

from typing import Any

import pytest

from services.preparer import cdi, cdicheck
from services.preparer.checkpoint import GroupState
from tests.helpers.cdicases import CASES, broken, good
from tests.helpers.cdistate import FACTS, UID, gpu, mig, vfio


def test_a_good_spec_has_no_problems() -> None:
    assert cdicheck.problems(good()) == []


@pytest.mark.parametrize("change", sorted(CASES))
def test_each_rule_names_the_field_and_the_reason(change: str) -> None:
    assert cdicheck.problems(broken(change)) == [CASES[change]]


@pytest.mark.parametrize("hostile", [None, [], "spec", 7, {"devices": "x", "kind": 3}])
def test_hostile_documents_are_reported_not_raised(hostile: Any) -> None:
    assert cdicheck.problems(hostile) != []


def rendered() -> list[dict[str, Any]]:
    default = GroupState(kind="GpuConfig", origin="default")
    return [
        cdi.render(UID, [gpu()], [default], FACTS),
        cdi.render(UID, [mig()], [GroupState(kind="MigDeviceConfig", origin="default")], FACTS),
        cdi.render(UID, [vfio()], [GroupState(kind="VfioDeviceConfig", origin="default")], FACTS),
    ]


def test_every_rendered_kind_passes() -> None:
    for spec in rendered():
        assert cdicheck.problems(spec) == []
