"""Our .proto files against the kubelet's own, compiled from k8s.io/kubelet.

proto/ describes the kubelet APIs of k8s.io/kubelet KUBELET_VERSION, the
kubelet of the control plane's default Kubernetes. The module is fetched with
``go mod download`` from a scratch directory into gpudra's Go module cache
(which the control plane's build fills, so it is usually there already): the
test neither builds the control plane nor follows whichever Kubernetes a
compatibility build pins. Both sides are compiled with protoc into
descriptors and compared as the wire sees them: package, every message (nested
ones and map entries too), field names, numbers, types and labels, enums,
services and their methods' types and streaming.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[3]
PAIRS = {  # ours (under proto/) -> upstream (under the module's pkg/apis/)
    "kubelet/dra/v1/api.proto": "dra/v1/api.proto",
    "kubelet/dra/v1beta1/api.proto": "dra/v1beta1/api.proto",
    "kubelet/pluginregistration/v1/api.proto": "pluginregistration/v1/api.proto",
    "kubelet/drahealth/v1/api.proto": "dra-health/v1/api.proto",
    "kubelet/drahealth/v1alpha1/api.proto": "dra-health/v1alpha1/api.proto",
}
# The version proto/ follows: Kubernetes 1.37.2's kubelet (dra-health/v1 is new
# there; v1alpha1's `message` came in 1.36, and older kubelets ignore it).
KUBELET_VERSION = "v0.37.2"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def kubelet_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The k8s.io/kubelet source of KUBELET_VERSION, from gpudra's Go module cache."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        pytest.skip("no Go toolchain to fetch k8s.io/kubelet with")
    cache = Path(os.environ.get("GPUDRA_CACHE", Path.home() / ".cache" / "gpudra"))
    env = {
        **os.environ,
        "GOMODCACHE": str(cache / "go" / "mod"),
        "GOFLAGS": "-mod=readonly",
        "GOTOOLCHAIN": "local",
    }
    out = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubelet@{KUBELET_VERSION}"],
        cwd=tmp_path_factory.mktemp("no-module"),  # outside any Go module
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return Path(json.loads(out.stdout)["Dir"])


def compile_proto(path: Path) -> descriptor_pb2.FileDescriptorProto:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = ["protoc", f"-I{path.parent}", f"--descriptor_set_out={out}", path.name]
        assert protoc.main(args) == 0, f"protoc failed on {path}"
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (file,) = files.file
    return file


def shape(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """What reaches the wire, with type names relative to the file's package."""
    prefix = f".{file.package}."
    return {
        "package": file.package,
        "messages": {m.name: _message(m, prefix) for m in file.message_type},
        "enums": {e.name: _enum(e) for e in file.enum_type},
        "services": {
            s.name: {
                m.name: (
                    m.input_type.removeprefix(prefix),
                    m.output_type.removeprefix(prefix),
                    m.client_streaming,
                    m.server_streaming,
                )
                for m in s.method
            }
            for s in file.service
        },
    }


def _message(message: descriptor_pb2.DescriptorProto, prefix: str) -> dict[str, Any]:
    return {
        "fields": {
            f.name: (f.number, f.type, f.label, f.type_name.removeprefix(prefix), f.proto3_optional)
            for f in message.field
        },
        "nested": {m.name: _message(m, prefix) for m in message.nested_type},
        "enums": {e.name: _enum(e) for e in message.enum_type},
        "oneofs": [o.name for o in message.oneof_decl if not o.name.startswith("_")],
    }


def _enum(enum: descriptor_pb2.EnumDescriptorProto) -> dict[str, int]:
    return {v.name: v.number for v in enum.value}


@pytest.mark.parametrize("ours", sorted(PAIRS))
def test_our_proto_is_the_kubelets_on_the_wire(ours: str, kubelet_module: Path) -> None:
    upstream = kubelet_module / "pkg" / "apis" / PAIRS[ours]
    assert upstream.is_file(), f"{upstream} missing from k8s.io/kubelet"
    assert shape(compile_proto(REPO / "proto" / ours)) == shape(compile_proto(upstream))
