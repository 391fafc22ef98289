"""OCI layers and archives as services/local/oci.py writes them: what ``ctr images import``
and a container runtime read (the layout, digests, ownership and modes)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tarfile
from pathlib import Path
from typing import Any

import pytest

from services.local import oci


def _tree(root: Path) -> Path:
    (root / "usr/local/bin").mkdir(parents=True)
    tool = root / "usr/local/bin/tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o700)
    (root / "usr/local/lib").mkdir()
    data = root / "usr/local/lib/data.txt"
    data.write_text("x")
    data.chmod(0o600)
    (root / "usr/local/lib/link").symlink_to("data.txt")
    return root


def test_equal_trees_give_equal_layers_owned_by_root_with_plain_modes(tmp_path: Path) -> None:
    a = oci.layer_from_dir(_tree(tmp_path / "a"), tmp_path / "a.tar")
    b_root = _tree(tmp_path / "b")
    os.utime(b_root / "usr/local/lib/data.txt", (1e9, 1e9))
    b = oci.layer_from_dir(b_root, tmp_path / "b.tar")
    assert a.digest == b.digest and a.size == b.size
    assert a.digest == "sha256:" + hashlib.sha256((tmp_path / "a.tar").read_bytes()).hexdigest()
    with tarfile.open(a.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"usr", "usr/local", "usr/local/bin", "usr/local/bin/tool",
                            "usr/local/lib", "usr/local/lib/data.txt",
                            "usr/local/lib/link"}  # fmt: skip
    for m in members.values():
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "root", "root", 0)
    assert members["usr/local/bin/tool"].mode == 0o755  # executable for every user
    assert members["usr/local/lib/data.txt"].mode == 0o644  # readable by the non-root users
    assert members["usr/local/lib"].mode == 0o755
    assert members["usr/local/lib/link"].issym()
    assert members["usr/local/lib/link"].linkname == "data.txt"
    names = [m.name for m in tarfile.open(a.path).getmembers()]
    assert names.index("usr/local") < names.index("usr/local/bin/tool")  # parents first


def test_a_socket_in_the_tree_is_refused_by_path(tmp_path: Path) -> None:
    root = _tree(tmp_path / "r")
    path = root / "usr/s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(oci.OCIError, match=f"{path}: only files, directories and symlinks"):
            oci.layer_from_dir(root, tmp_path / "l.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no layer, no partial file


def _read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_archive_is_an_oci_layout_naming_the_image(tmp_path: Path) -> None:
    layer = oci.layer_from_dir(_tree(tmp_path / "t"), tmp_path / "l.tar")
    config = oci.image_config([layer], {"Env": ["PATH=/usr/bin"], "Entrypoint": ["tool"],
                                        "Labels": {"a": "b"}})  # fmt: skip
    out = tmp_path / "image.tar"
    digest = oci.write_archive([layer], config, "example.local/tool:v1", out)
    files = _read_archive(out)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():  # every blob is named by its content's digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"] == {"io.containerd.image.name": "example.local/tool:v1",
                                    "org.opencontainers.image.ref.name": "v1"}  # fmt: skip
    manifest: dict[str, Any] = json.loads(files["blobs/sha256/" + digest[7:]])
    assert manifest["mediaType"] == oci.MANIFEST_MEDIA_TYPE
    assert manifest["layers"] == [{"mediaType": oci.LAYER_MEDIA_TYPE, "digest": layer.digest,
                                   "size": layer.size}]  # fmt: skip
    got = json.loads(files["blobs/sha256/" + manifest["config"]["digest"][7:]])
    assert got["rootfs"] == {"type": "layers", "diff_ids": [layer.digest]}
    assert got["config"]["Entrypoint"] == ["tool"] and got["config"]["Labels"] == {"a": "b"}


def test_an_image_name_without_a_tag_is_refused(tmp_path: Path) -> None:
    layer = oci.layer_from_dir(_tree(tmp_path / "t"), tmp_path / "l.tar")
    config = oci.image_config([layer], {})
    with pytest.raises(oci.OCIError, match="expected repository:tag"):
        oci.write_archive([layer], config, "localhost:5000/tool", tmp_path / "i.tar")
    assert not (tmp_path / "i.tar").exists()
