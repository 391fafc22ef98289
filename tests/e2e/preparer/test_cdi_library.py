"""cdicheck against the official CDI library: both refuse the same broken specs.

Each case of tests/unit/preparer/test_cdicheck.py is written into its own spec
directory and loaded by ``controlplane cdi`` (tags.cncf.io/container-device-
interface, what containerd and CRI-O use). A spec cdicheck passes must load and
inject; a spec it refuses must be refused by the library too, so the unit
tests' rules are the runtimes' rules.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.preparer import cdicheck
from tests.helpers.cdicases import CASES, broken, good

pytestmark = pytest.mark.e2e

#: Where cdicheck is stricter than the library version we build, and why.
STRICTER = {
    # A negative number is the cgroup wildcard: -1 would allow every char device.
    # Newer library versions refuse it too; v1.1.1 still injects it.
    "node-major": "v1.1.1 accepts negative device numbers",
}


def load(binary: Path, tmp_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "k8s.gpu.nvidia.com-claim_test.yaml").write_text(yaml.safe_dump(spec))
    device = f"{spec.get('kind')}={good()['devices'][0]['name']}"
    proc = subprocess.run(
        [str(binary), "cdi", "--spec-dir", str(spec_dir), "--", device],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    result["rc"] = proc.returncode
    return result


def test_a_good_spec_loads_and_injects(controlplane_binary: Path, tmp_path: Path) -> None:
    spec = good()
    spec["devices"][0]["containerEdits"]["deviceNodes"][0].update(major=195, minor=0)
    result = load(controlplane_binary, tmp_path, spec)
    assert result["rc"] == 0, result
    assert [d["path"] for d in result["ociSpec"]["linux"]["devices"]] == ["/dev/nvidia0"]


@pytest.mark.parametrize("change", sorted(CASES))
def test_the_library_refuses_what_cdicheck_refuses(
    change: str, controlplane_binary: Path, tmp_path: Path
) -> None:
    spec = broken(change)
    for node in (
        spec["devices"][0]["containerEdits"].get("deviceNodes", []) if spec["devices"] else []
    ):
        node.setdefault("major", 195)  # so a refusal is about the rule, not a missing node
    assert cdicheck.problems(spec), change
    result = load(controlplane_binary, tmp_path, spec)
    if change in STRICTER:
        assert result["rc"] == 0, f"the library now refuses {change}: drop it from STRICTER"
        return
    refused = result["specErrors"] or result.get("unresolved") or result.get("injectError")
    assert result["rc"] != 0 and refused, (change, result)
