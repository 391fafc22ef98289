"""The CDI loader's rules in cdicheck: each one caught on a spec that breaks it.

The rules mirror tags.cncf.io/container-device-interface v1.1 (what containerd
and CRI-O load specs with); e2e loads every spec the preparer writes with that
library itself. When the official CDI JSON schema sits beside the checkout
(``../shared/cdi-schema``), the rendered specs are also checked against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.preparer import cdi, cdicheck
from services.preparer.checkpoint import GroupState
from tests.helpers.cdicases import CASES, broken, good
from tests.helpers.cdistate import FACTS, UID, gpu, mig, vfio

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "shared" / "cdi-schema"


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


@pytest.mark.skipif(
    not (SCHEMA_DIR / "schema.json").is_file(),
    reason=f"the CDI JSON schema is not beside the checkout ({SCHEMA_DIR}); "
    "the runtime checks above and the e2e CDI library load still ran",
)
def test_rendered_specs_match_the_official_json_schema() -> None:
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry: Registry[Any] = Registry().with_resources(
        [("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))]
    )
    validator = jsonschema.Draft7Validator(schema, registry=registry)
    for spec in rendered():
        validator.validate(spec)
