"""Claims kube-scheduler's PreFilter keeps waiting: gpudra and the upstream allocator agree.

A claim whose DeviceClass does not exist (yet) is unschedulable, not an error,
in both, with the same reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.scenarios import MISSING_CLASS_CLAIMS

pytestmark = pytest.mark.e2e


def outcomes(argv: list[str]) -> dict[str, tuple[str, str | None]]:
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)
    return {c["name"]: (c["status"], c.get("error")) for c in json.loads(out.stdout)["claims"]}


def test_a_missing_class_is_unschedulable_in_both(
    controlplane_binary: Path, tmp_path: Path
) -> None:
    inputs = tmp_path / "in.yaml"
    inputs.write_text(MISSING_CLASS_CLAIMS)
    ours = outcomes(
        [sys.executable, "-m", "services.cli", "allocate", "-f", str(inputs), "-o", "json"]
    )
    upstream = outcomes(
        [str(controlplane_binary), "reference-allocator", "-f", str(inputs), "-o", "json"]
    )
    assert ours == upstream == {"nocls": ("unschedulable", None), "sub": ("unschedulable", None)}
