"""The CDI loader's rules in cdicheck: each one caught on a spec that breaks it.

The rules mirror tags.cncf.io/container-device-interface v1.1 (what containerd
and CRI-O load specs with); e2e loads specs with that library itself: these cases in
tests/e2e/preparer/test_cdi_library.py, every spec the preparer writes for the examples in
tests/e2e/local/test_stack.py. Nothing here reads a file outside the repository (a clone
has nothing beside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.preparer import cdi, cdicheck
from services.preparer.checkpoint import GroupState
from tests.helpers.cdicases import CASES, broken, good
from tests.helpers.cdistate import UID, VERSION, generator, gpu, mig, vfio


def test_a_good_spec_has_no_problems() -> None:
    assert cdicheck.problems(good()) == []


@pytest.mark.parametrize("change", sorted(CASES))
def test_each_rule_names_the_field_and_the_reason(change: str) -> None:
    assert cdicheck.problems(broken(change)) == [CASES[change]]


@pytest.mark.parametrize("hostile", [None, [], "spec", 7, {"devices": "x", "kind": 3}])
def test_hostile_documents_are_reported_not_raised(hostile: Any) -> None:
    assert cdicheck.problems(hostile) != []


def rendered(root: Path) -> list[dict[str, Any]]:
    gen = generator(root)
    return [
        cdi.render(UID, [device], [GroupState(kind=kind, origin="default")], gen, VERSION)
        for device, kind in (
            (gpu(), "GpuConfig"),
            (mig(), "MigDeviceConfig"),
            (vfio(), "VfioDeviceConfig"),
        )
    ]


def test_every_rendered_kind_passes(tmp_path: Path) -> None:
    for spec in rendered(tmp_path / "driver"):
        assert cdicheck.problems(spec) == []
