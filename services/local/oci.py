"""OCI image archives without a registry or a container engine.

:func:`layer_from_dir` packs a directory as an image layer (a plain tar, owned by
root, every timestamp the same, so equal trees give equal digests); :func:`write_archive`
writes an OCI image layout as one tar file (``oci-layout``, ``index.json``, the
blobs), which ``ctr images import`` reads. Layers stay uncompressed: the archive
only travels to a containerd on the same machine, and gzip would cost more CPU
time than the copy it saves.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
#: Every file's mtime in a layer we pack (bytecode is hash-checked, not by mtime).
EPOCH = 0


class OCIError(RuntimeError):
    """A layer or archive that cannot be made (which file, what was wrong)."""


@dataclass(frozen=True)
class Layer:
    """An uncompressed layer tar: its digest is also its diff id."""

    path: Path
    digest: str  # sha256:<hex>
    size: int

    @classmethod
    def of(cls, path: Path) -> Layer:
        return cls(path, "sha256:" + sha256_file(path), path.stat().st_size)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _partial(out: Path) -> Iterator[Path]:
    """Write to ``out``.part, renamed to ``out`` when complete and removed otherwise."""
    tmp = out.with_name(out.name + ".part")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.rename(out)


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = EPOCH
    if info.isdir():
        info.mode = 0o755
    elif info.isfile():
        info.mode = 0o755 if info.mode & stat.S_IXUSR else 0o644
    return info


def layer_from_dir(root: Path, out: Path) -> Layer:
    """Pack everything under ``root`` as paths relative to ``/``, in sorted order, with the
    parent directories; files 0644 (0755 if executable), directories 0755, owner root."""
    if not root.is_dir():
        raise OCIError(f"{root}: not a directory")
    with _partial(out) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            here = Path(dirpath)
            for name in [*sorted(filenames), *dirnames]:
                path = here / name
                arcname = path.relative_to(root).as_posix()
                info = tar.gettarinfo(str(path), arcname)
                if info is None or not (info.isfile() or info.isdir() or info.issym()):
                    raise OCIError(f"{path}: only files, directories and symlinks go in a layer")
                _normalised(info)
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return Layer.of(out)


def image_config(layers: Sequence[Layer], config: Mapping[str, Any]) -> dict[str, Any]:
    """The image configuration: ``config`` is what the runtime reads (Env, Entrypoint,
    Cmd, WorkingDir, Labels...), the layers are its root filesystem, bottom first."""
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
        "history": [{"created_by": f"gpudra layer {i}"} for i in range(len(layers))],
    }


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _normalised(tarfile.TarInfo(name))
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_archive(layers: Sequence[Layer], config: Mapping[str, Any], name: str, out: Path) -> str:
    """An OCI layout tar with one image named ``name`` (``repo:tag``); its manifest digest.

    ``ctr images import`` takes the name from the ``io.containerd.image.name``
    annotation; ``org.opencontainers.image.ref.name`` carries the tag for other tools.
    """
    if ":" not in name.rsplit("/", 1)[-1]:
        raise OCIError(f"image name {name!r}: expected repository:tag")
    config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest,
                   "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest, "size": layer.size}
                   for layer in layers],
    }  # fmt: skip
    manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest,
            "size": len(manifest_bytes), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        }],
    }  # fmt: skip
    with _partial(out) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in ((config_digest, config_bytes), (manifest_digest, manifest_bytes)):
            _add_bytes(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), data)
        for layer in layers:
            info = _normalised(tarfile.TarInfo("blobs/sha256/" + layer.digest[7:]))
            info.size = layer.size
            with open(layer.path, "rb") as f:
                tar.addfile(info, f)
    return manifest_digest
