"""Differential test on seeded random CEL selectors (tests/helpers/celfuzz.py):
``gpudra allocate --kube-version 1.N`` and ``reference-allocator`` of 1.N must
give the same outcome for each (refused with exit 2, or the claim allocated,
unschedulable or in error), for 1.37, 1.35 and 1.34 (tests/helpers/diffminors.py):
1.34 validates new selectors without cel-go's lists extension, which the fuzz uses.

Reproduce: ``GPUDRA_DIFF_SEED=<seed> pytest tests/e2e/allocator/test_differential_cel.py``.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from services.allocator.cel import goregexp
from services.allocator.structured.features import DEFAULT_MINOR
from services.cli import main as gpudra
from tests.helpers.celfuzz import expression
from tests.helpers.diffcases import base, claim, exactly
from tests.helpers.diffminors import minors

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GPUDRA_DIFF_SEED", "20261122"))
EXPRESSIONS = int(os.environ.get("GPUDRA_DIFF_CEL", "300"))
PER_TEST = 25


MINORS = minors()


@pytest.fixture(scope="module")
def references(
    controlplane_binary: Path, controlplane_for: Callable[[int], Path]
) -> Callable[[int], Path]:
    def reference(minor: int) -> Path:
        binary = controlplane_binary if minor == DEFAULT_MINOR else controlplane_for(minor)
        return binary.parent / "reference-allocator"

    return reference


def _outcome(code: int, stdout: str) -> str:
    return json.loads(stdout)["claims"][0]["status"] if code == 0 else f"exit {code}"


@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("batch", range((EXPRESSIONS + PER_TEST - 1) // PER_TEST))
def test_selectors_agree(
    minor: int, batch: int, references: Callable[[int], Path], tmp_path: Path
) -> None:
    reference = references(minor)
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
            code = gpudra(
                ["allocate", "--kube-version", f"1.{minor}", "-f", str(path), "-o", "json"]
            )
        ours, theirs = _outcome(code, out.getvalue()), _outcome(ref.returncode, ref.stdout)
        if ours != theirs:
            failures.append(
                f"{text}\n    ours {ours}: {err.getvalue() or out.getvalue()}\n"
                f"    reference {theirs}: {ref.stderr or ref.stdout}"
            )
    assert not failures, f"1.{minor}, seed {SEED}, batch {batch}:\n" + "\n".join(failures)


def _go() -> str | None:
    local = Path("/usr/local/go/bin/go")
    return shutil.which("go") or (str(local) if local.exists() else None)


@pytest.mark.skipif(_go() is None, reason="no Go toolchain to compare the tables with")
def test_regex_unicode_tables_match_the_go_toolchain(tmp_path: Path) -> None:
    """services/allocator/cel/data/gounicode.json is what data/gounicode.go writes with
    the Go that builds the control plane (regenerate it when that Go's tables change)."""
    source = Path(goregexp.__file__).parent / "data"
    out = subprocess.run(
        [str(_go()), "run", str(source / "gounicode.go")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "GOTOOLCHAIN": "local"},
        cwd=tmp_path,
    ).stdout
    assert json.loads(out) == json.loads((source / "gounicode.json").read_text())
