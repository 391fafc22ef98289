"""Generate the Python gRPC stubs for proto/ into services/proto_gen/.

    python proto/generate.py [--out DIR]

The proto tree is mounted as the virtual import root ``services/proto_gen``,
so the generated modules import each other as ``services.proto_gen...`` and
need no editing afterwards. Output is written to a temporary tree first and
then swapped in whole, so a failed run never leaves half a package behind and
a deleted .proto never leaves a stale module. The result depends only on the
.proto files and the pinned grpcio-tools version, which is what lets a unit
test regenerate it and compare byte for byte.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE = Path("services/proto_gen")
HEADER = '"""Generated from proto/ by proto/generate.py (`make proto`). Do not edit."""\n'


def proto_files() -> list[Path]:
    """Every .proto under proto/, relative to it, in a stable order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in PROTO_ROOT.rglob("*.proto"))


def generate(out: Path) -> Path:
    """Write the generated package under ``out``; return the package directory."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PACKAGE.as_posix()}={PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[(PACKAGE / p).as_posix() for p in proto_files()],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed (see the message above)")
        built = Path(tmp) / PACKAGE
        _add_init_files(built)
        target = out / PACKAGE
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built, target)
    return target


def _add_init_files(package: Path) -> None:
    """Make every generated directory a regular package (setuptools finds only those)."""
    for directory in [package, *sorted(d for d in package.rglob("*") if d.is_dir())]:
        (directory / "__init__.py").write_text(HEADER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="root to write into")
    args = parser.parse_args(argv)
    target = generate(args.out)
    print(f"generated {sum(1 for _ in target.rglob('*.py*'))} files into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
