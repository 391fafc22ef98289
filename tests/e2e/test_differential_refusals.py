"""Differential test on seeded broken inputs: ``gpudra allocate`` must refuse what
kube-apiserver 1.35 refuses, where and as ``reference-allocator`` (which runs the
API server's own decoding, defaulting and validation) refuses it.

Each case is a generated scenario (tests/helpers/scenarios.py, the gates of
its index among all 64 combinations) with one breakage
(tests/helpers/mutations.py). Both tools must exit 2 naming the same document,
and the first error must be the same field with the same kind of error
(``Invalid value``, ``Required value``, ``Forbidden``, ``Too many``, strict
decoding).

Reproduce: ``GPUDRA_DIFF_SEED=<seed> pytest tests/e2e/test_differential_refusals.py``.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from services.cli import main as gpudra
from tests.helpers.mutations import MUTATIONS
from tests.helpers.scenarios import GATE_SETS, generate

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GPUDRA_DIFF_SEED", "20261122"))
CASES = int(os.environ.get("GPUDRA_DIFF_REFUSALS", "128"))
_WHERE = re.compile(r"document \d+(, item \d+)?: ")
_OBJECT = re.compile(r"^(invalid )?(DeviceClass|ResourceSlice|ResourceClaim)( [^ :]+)?: ")
_TYPE = re.compile(
    r"^(.*?): (Invalid value|Required value|Forbidden|Too many|Unsupported value|"
    r"Internal error|Too long)"
)


@pytest.fixture(scope="module")
def reference(controlplane_binary: Path) -> Path:
    return controlplane_binary.parent / "reference-allocator"


def _first_error(stderr: str) -> tuple[str, str]:
    """(document, first error as field and kind) of either tool's message."""
    where = _WHERE.search(stderr)
    assert where, stderr
    message = _OBJECT.sub("", stderr[where.end() :].strip())
    first = message.split("; ")[0]
    typed = _TYPE.match(first)
    return where.group(0), (f"{typed.group(1)}: {typed.group(2)}" if typed else first)


def _case(index: int) -> tuple[str, list[dict[str, object]], str]:
    gates = GATE_SETS[index % len(GATE_SETS)]
    objects = generate(SEED, 1000 + index, gates).objects()
    rng = random.Random(SEED * 7919 + index)
    for step in range(len(MUTATIONS)):
        mutation = MUTATIONS[(index + step) % len(MUTATIONS)]
        if mutation(rng, objects):
            return gates, objects, mutation.__name__
    raise AssertionError(f"no mutation applies to scenario {index}")


@pytest.mark.parametrize("index", range(CASES))
def test_both_refuse_alike(index: int, reference: Path, tmp_path: Path) -> None:
    gates, objects, mutation = _case(index)
    path = tmp_path / f"refusal-{index}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    args = ["-f", str(path), "-o", "json", "--feature-gates", gates]
    ref = subprocess.run([str(reference), *args], capture_output=True, text=True, timeout=60)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra(["allocate", *args])
    context = f"seed {SEED}, case {index} ({mutation}, gates {gates}), input {path}"
    assert (code, ref.returncode) == (2, 2), f"{context}: {err.getvalue()} | {ref.stderr}"
    assert _first_error(err.getvalue()) == _first_error(ref.stderr), (
        f"{context}:\n  ours: {err.getvalue()}\n  reference: {ref.stderr}"
    )
