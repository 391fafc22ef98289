"""Differential test on seeded random CEL selectors (tests/helpers/celfuzz.py):
``gpudra allocate`` and ``reference-allocator`` must give the same outcome for
each (refused with exit 2, or the claim allocated, unschedulable or in error).

Reproduce: ``GPUDRA_DIFF_SEED=<seed> pytest tests/e2e/test_differential_cel.py``.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from services.cli import main as gpudra
from tests.helpers.celfuzz import expression
from tests.helpers.diffcases import base, claim, exactly

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GPUDRA_DIFF_SEED", "20261122"))
EXPRESSIONS = int(os.environ.get("GPUDRA_DIFF_CEL", "300"))
PER_TEST = 25


@pytest.fixture(scope="module")
def reference(controlplane_binary: Path) -> Path:
    return controlplane_binary.parent / "reference-allocator"


def _outcome(code: int, stdout: str) -> str:
    return json.loads(stdout)["claims"][0]["status"] if code == 0 else f"exit {code}"


@pytest.mark.parametrize("batch", range((EXPRESSIONS + PER_TEST - 1) // PER_TEST))
def test_selectors_agree(batch: int, reference: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED * 1_000_003 + batch)
    failures = []
    for n in range(min(PER_TEST, EXPRESSIONS - batch * PER_TEST)):
        text = expression(rng)
        path = tmp_path / f"selector-{n}.json"
        items = [*base(), claim(exactly(text))]
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        ref = subprocess.run(
            [str(reference), "-f", str(path), "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = gpudra(["allocate", "-f", str(path), "-o", "json"])
        ours, theirs = _outcome(code, out.getvalue()), _outcome(ref.returncode, ref.stdout)
        if ours != theirs:
            failures.append(
                f"{text}\n    ours {ours}: {err.getvalue() or out.getvalue()}\n"
                f"    reference {theirs}: {ref.stderr or ref.stdout}"
            )
    assert not failures, f"seed {SEED}, batch {batch}:\n" + "\n".join(failures)
