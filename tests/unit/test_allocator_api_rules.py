"""``gpudra allocate`` on the hand-written differential cases, without the reference.

tests/e2e/test_differential_cases.py runs each case through both tools and
asserts they agree; here each runs through ours alone (no control plane
needed), so the API server's validation, the Kubernetes CEL environment and
the outcome rules are checked in every unit run: the exit status, the API
server's words on exit 2, each claim's status on exit 0, and gpudra's side of
each documented deviation.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as gpudra
from tests.helpers.diffcases import ANY_CLASS, CASES, DEVIATIONS, Case, Deviation, base


def _run(items: list[dict[str, Any]], gates: str, tmp_path: Path) -> tuple[int, str, str]:
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    out, err = io.StringIO(), io.StringIO()
    args = ["allocate", "-f", str(path), "-o", "json"]
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra([*args, *(["--feature-gates", gates] if gates else [])])
    return code, out.getvalue(), err.getvalue()


def _statuses(stdout: str) -> dict[str, str]:
    return {c["name"]: c["status"] for c in json.loads(stdout)["claims"]}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case, tmp_path: Path) -> None:
    code, stdout, stderr = _run(base() + case.objects, case.gates, tmp_path)
    assert code == case.rc, stderr
    if case.rc == 2:
        assert case.says in stderr and "document 1, item" in stderr, stderr
    else:
        assert _statuses(stdout) == case.statuses, stdout


@pytest.mark.parametrize("deviation", DEVIATIONS, ids=[d.name for d in DEVIATIONS])
def test_deviation_keeps_the_right_outcome(deviation: Deviation, tmp_path: Path) -> None:
    code, stdout, stderr = _run([ANY_CLASS, *deviation.objects], deviation.gates, tmp_path)
    assert code == 0, stderr
    assert _statuses(stdout) == deviation.ours, stdout


def test_a_valid_object_after_an_invalid_one_is_never_reached(tmp_path: Path) -> None:
    """The first refused object stops the run: nothing is allocated from half an input."""
    bad = {**base()[0], "metadata": {"name": "bad"}, "spec": {"selectors": [{"cel": {}}]}}
    code, stdout, stderr = _run([bad, *base()], "", tmp_path)
    assert code == 2 and stdout == ""
    assert "document 1, item 1: invalid DeviceClass" in stderr and "expression" in stderr, stderr
