"""The examples of the demo: ``examples/*.yaml``, each with the pods it expects to run.

Every example file holds its namespace, claims or claim templates and pods. A pod
is expected to end Running unless it carries the annotation ``gpudra.dev/expect:
Pending`` (the unsatisfiable example). An example with a ComputeDomain needs nodes
in an NVLink fabric (:data:`~services.local.stacknodes.GB200_DEMO_NODES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.core.model import computedomain as cd
from services.local import REPO

EXAMPLES_DIR = REPO / "examples"
EXPECT_ANNOTATION = "gpudra.dev/expect"
RUNNING = "Running"
PENDING = "Pending"


class ExampleError(ValueError):
    """An example file that cannot be used (names the file and what is wrong)."""


@dataclass(frozen=True)
class ExamplePod:
    namespace: str
    name: str
    expect: str  # RUNNING or PENDING


@dataclass(frozen=True)
class Example:
    path: Path
    title: str  # the header comment's first line
    text: str
    pods: tuple[ExamplePod, ...]
    domains: tuple[str, ...] = ()  # its ComputeDomains' names: it needs GB200 nodes

    @property
    def name(self) -> str:
        return self.path.name


def load_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Every ``*.yaml`` in ``directory``, in name order."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise ExampleError(f"no *.yaml examples in {directory}")
    return [load_example(path) for path in files]


def gpu_only(examples: Sequence[Example]) -> list[Example]:
    """Those of ``examples`` without a ComputeDomain: what a stack of the GPU demo
    nodes (or of real nodes) runs; the others need the GB200 demo nodes."""
    return [e for e in examples if not e.domains]


def load_example(path: Path) -> Example:
    text = path.read_text()
    try:
        documents = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise ExampleError(f"{path}: not YAML: {exc}") from None
    pods: list[ExamplePod] = []
    domains: list[str] = []
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict) or "kind" not in doc:
            raise ExampleError(f"{path}: document {index + 1} is not a Kubernetes object")
        if doc["kind"] == cd.KIND:
            domains.append(str((doc.get("metadata") or {}).get("name")))
        if doc["kind"] != "Pod":
            continue
        meta = doc.get("metadata") or {}
        expect = (meta.get("annotations") or {}).get(EXPECT_ANNOTATION, RUNNING)
        if expect not in (RUNNING, PENDING):
            raise ExampleError(
                f"{path}: pod {meta.get('name')}: {EXPECT_ANNOTATION} must be "
                f"{RUNNING} or {PENDING}, got {expect!r}"
            )
        if not meta.get("namespace") or not meta.get("name"):
            raise ExampleError(f"{path}: document {index + 1}: a pod needs a namespace and name")
        pods.append(ExamplePod(meta["namespace"], meta["name"], expect))
    return Example(path, _title(text), text, tuple(pods), tuple(domains))


def _title(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""
