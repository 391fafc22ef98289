"""The import contracts of `make lint` hold, and each breaks when code crosses it.

lint-imports runs on a copy of the tree, once as it is and once with a planted
violation, so a contract that could never fail (a typo in a module name, a
package the checker cannot see) fails this test instead.

No module of services or bench imports itself through others: grimp's graph holds
every import, the ones under ``if TYPE_CHECKING:`` and inside functions too, so a
cycle hidden from the interpreter still fails here; planted cycles show it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def copy_tree(dst: Path) -> Path:
    for package in ("services", "tests", "bench"):
        shutil.copytree(
            REPO / package, dst / package, ignore=shutil.ignore_patterns("__pycache__", "*.go")
        )
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    return dst


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("tree"))


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("where", "line", "contract"),
    [
        ("services/preparer/planted.py", "import services.publisher.render", "independent"),
        ("services/core/planted.py", "from services.allocator import cli", "imports no service"),
        # Each kernel layer imports only those below it: one arrow up per layer boundary.
        ("services/core/kit/planted.py", "import services.core.kube.client", "in layers"),
        ("services/core/kube/planted.py", "import services.core.model.nvidia", "in layers"),
        ("services/core/model/planted.py", "import services.core.telemetry.logs", "in layers"),
        ("services/core/telemetry/planted.py", "import services.core.bus.subjects", "in layers"),
        ("services/core/bus/planted.py", "import services.core.process.config", "in layers"),
        ("services/kubeletplugin/planted.py", "import services.local.cluster", "tools"),
        ("bench/planted.py", "import tests.helpers.preparer", "outside the tests"),
    ],
)
def test_a_planted_violation_breaks_its_contract(
    tmp_path: Path, where: str, line: str, contract: str
) -> None:
    root = copy_tree(tmp_path)
    (root / where).write_text(f'"""Planted by the test."""\n\n{line}\n')
    result = lint(root)
    assert result.returncode != 0, result.stdout
    broken = [row for row in result.stdout.splitlines() if " BROKEN" in row]
    assert len(broken) == 1 and contract in broken[0], result.stdout


# ---- no module cycles --------------------------------------------------------------

CYCLE_FREE = ("services", "bench")

# Run in a copy of the tree (grimp finds a package by import, so not in this process).
CYCLES_IN_COPY = f"""
import json, grimp
from tests.unit.project.test_import_contracts import module_cycles
graph = grimp.build_graph(*{CYCLE_FREE!r}, include_external_packages=False, cache_dir=None)
print(json.dumps(module_cycles(graph)))
"""


def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*CYCLE_FREE, include_external_packages=False, cache_dir=None)


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each set of modules that import one another, directly or through others."""
    seen: set[str] = set()
    cycles = []
    for module in sorted(graph.modules):
        if module in seen:
            continue
        loop = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        if loop:
            cycle = sorted({module, *loop})
            seen.update(cycle)
            cycles.append(cycle)
    return cycles


def describe(graph: grimp.ImportGraph, cycle: list[str]) -> str:
    """The imports that close ``cycle``, one a line, where they are written."""
    members = set(cycle)
    return "\n".join(
        f"  {d['importer']}:{d['line_number']}: {d['line_contents']}"
        for importer in cycle
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members)
        for d in graph.get_import_details(importer=importer, imported=imported)
    )


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert len(graph.modules) > 300  # the packages were found, not an empty graph
    cycles = module_cycles(graph)
    assert not cycles, "module cycles:\n" + "\n\n".join(describe(graph, c) for c in cycles)


def test_a_planted_import_closes_a_cycle() -> None:
    graph = import_graph()
    # driverroot builds with driverkernel; the builder must not name DriverRoot back.
    graph.add_import(
        importer="services.local.driverkernel",
        imported="services.local.driverroot",
        line_number=1,
        line_contents="from services.local.driverroot import DriverRoot",
    )
    cycles = module_cycles(graph)
    assert cycles == [["services.local.driverkernel", "services.local.driverroot"]], cycles
    assert "driverkernel:1: from services.local.driverroot" in describe(graph, cycles[0])


@pytest.mark.parametrize(
    ("where", "planted", "cycle"),
    [
        (
            "services/local/driverkernel.py",
            "from typing import TYPE_CHECKING\n\n"
            "if TYPE_CHECKING:\n    from services.local.driverroot import DriverRoot\n",
            ["services.local.driverkernel", "services.local.driverroot"],
        ),
        (
            "services/local/cluster.py",
            'if __name__ == "__main__":\n    from services.local.clustercli import main\n',
            ["services.local.cluster", "services.local.clustercli"],
        ),
        (
            "bench/prepare.py",
            "def _peer() -> None:\n    import bench.peer\n",
            ["bench.peer", "bench.prepare"],
        ),
    ],
    ids=["type-checking", "main-guard", "in-a-function"],
)
def test_a_planted_cycle_is_found_in_the_tree(
    tmp_path: Path, where: str, planted: str, cycle: list[str]
) -> None:
    root = copy_tree(tmp_path)
    with (root / where).open("a") as f:
        f.write(f"\n\n{planted}")
    result = subprocess.run(
        [sys.executable, "-c", CYCLES_IN_COPY],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout) == [cycle], result.stdout
