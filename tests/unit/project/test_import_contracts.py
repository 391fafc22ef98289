"""The import contracts of `make lint` hold, and each breaks when code crosses it.

lint-imports runs on a copy of the tree, once as it is and once with a planted
violation, so a contract that could never fail (a typo in a module name, a
package the checker cannot see) fails this test instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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
