"""Differential test on seeded broken inputs: ``gpudra allocate --kube-version 1.N``
must refuse what kube-apiserver 1.N refuses, where and as ``reference-allocator``
of that release (which runs the API server's own decoding, defaulting, registry
strategies and validation) refuses it, for 1.37, 1.35 and 1.34
(tests/helpers/diffminors.py).

Each case is a generated scenario (tests/helpers/scenarios.py) under one of the
gate sets the release accepts (structured/features.py's accepted_sets, taken in
turn), with one breakage (tests/helpers/mutations.py: one per validation rule a
manifest can break, CEL selectors the API server refuses, 1.37's new fields with
the gates that keep them). Both tools must exit 2 naming the same document, and
the first error must be the same field with the same kind of error (``Invalid
value``, ``Required value``, ``Forbidden``, ``Too many``, ``Duplicate value``,
strict decoding, ...).

Reproduce: ``GPUDRA_DIFF_SEED=<seed> pytest tests/e2e/allocator/test_differential_refusals.py``.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import random
import re
import subprocess
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.allocator.structured import features as kube
from services.cli import main as gpudra
from tests.helpers.diffminors import minors
from tests.helpers.mutations import NEEDS, for_release
from tests.helpers.scenarios import generate

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GPUDRA_DIFF_SEED", "20261122"))
MINORS = minors()


def _cases(minor: int) -> int:
    return int(os.environ.get("GPUDRA_DIFF_REFUSALS", str(4 * len(for_release(minor)))))


PARAMS = [(minor, index) for minor in MINORS for index in range(_cases(minor))]
_WHERE = re.compile(r"document \d+(, item \d+)?: ")
_OBJECT = re.compile(r"^(invalid )?(DeviceClass|ResourceSlice|ResourceClaim)( [^ :]+)?: ")
_TYPE = re.compile(
    r"^(.*?): (Invalid value|Required value|Forbidden|Too many|Unsupported value|"
    r"Internal error|Too long|Duplicate value|Not found)"
)


@pytest.fixture(scope="module")
def references(
    controlplane_binary: Path, controlplane_for: Callable[[int], Path]
) -> Callable[[int], Path]:
    def reference(minor: int) -> Path:
        binary = controlplane_binary if minor == kube.DEFAULT_MINOR else controlplane_for(minor)
        return binary.parent / "reference-allocator"

    return reference


def _first_error(stderr: str) -> tuple[str, str]:
    """(document, first error as field and kind) of either tool's message."""
    where = _WHERE.search(stderr)
    assert where, stderr
    message = _OBJECT.sub("", stderr[where.end() :].strip())
    first = message.split("; ")[0]
    typed = _TYPE.match(first)
    return where.group(0), (f"{typed.group(1)}: {typed.group(2)}" if typed else first)


def _gates(minor: int, index: int, mutation: str) -> str:
    """The index's accepted gate set, with the gates the mutation's field needs (1.37)."""
    sets = kube.accepted_sets(minor)
    base = sets[index % len(sets)]
    known = kube.GATES[minor]
    pairs = [item.partition("=") for item in NEEDS.get(mutation, "").split(",") if item]
    needs = [(k, v) for k, _, v in pairs if k in known and not known[k].locked]
    if not needs:
        return base
    values = dict(item.partition("=")[::2] for item in base.split(",") if item)
    values.update(needs)
    spec = ",".join(f"{k}={v}" for k, v in values.items())
    kube.parse(spec, minor)  # a needed gate the release would refuse is a test bug
    return spec


def _scenario(index: int, gates: str, minor: int) -> list[dict[str, Any]]:
    """The scenario for the release (scenarios of 1.35's gates where the generator has
    no minor: the breakage, not the scenario, is what the test is about)."""
    make: Callable[..., Any] = generate
    if "minor" in inspect.signature(generate).parameters:
        return list(make(SEED, 1000 + index, gates, minor=minor).objects())
    return list(make(SEED, 1000 + index, kube.defaults(35).spec()).objects())


def _case(minor: int, index: int) -> tuple[str, list[dict[str, Any]], str]:
    rng = random.Random(SEED * 7919 + index)
    mutations = for_release(minor)
    for step in range(len(mutations)):
        mutation = mutations[(index + step) % len(mutations)]
        gates = _gates(minor, index, mutation.__name__)
        objects = _scenario(index, gates, minor)
        if mutation(rng, objects):
            return gates, objects, mutation.__name__
    raise AssertionError(f"no mutation applies to scenario {index}")


@pytest.mark.parametrize(("minor", "index"), PARAMS, ids=[f"{i}-{m}" for m, i in PARAMS])
def test_both_refuse_alike(
    minor: int, index: int, references: Callable[[int], Path], tmp_path: Path
) -> None:
    gates, objects, mutation = _case(minor, index)
    path = tmp_path / f"refusal-{index}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    args = ["-f", str(path), "-o", "json", "--feature-gates", gates]
    reference = references(minor)
    ref = subprocess.run([str(reference), *args], capture_output=True, text=True, timeout=60)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra(["allocate", "--kube-version", f"1.{minor}", *args])
    context = f"1.{minor}, seed {SEED}, case {index} ({mutation}, gates {gates}), input {path}"
    assert (code, ref.returncode) == (2, 2), f"{context}: {err.getvalue()} | {ref.stderr}"
    assert _first_error(err.getvalue()) == _first_error(ref.stderr), (
        f"{context}:\n  ours: {err.getvalue()}\n  reference: {ref.stderr}"
    )
