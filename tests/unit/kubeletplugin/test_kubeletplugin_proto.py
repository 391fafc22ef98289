"""Our .proto files against the kubelet's wire contract, and the generated stubs against drift.

Field numbers, types and names are read back from the generated descriptors
(what actually goes on the wire), and compared with the tables below, written
from k8s.io/kubelet v0.37.2 (dra/v1, dra/v1beta1, pluginregistration/v1,
dra-health/v1 and v1alpha1). tests/e2e/kubeletplugin/test_proto_upstream.py compiles those
upstream .proto files themselves and compares them with ours.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from services.proto_gen.kubelet.dra.v1 import api_pb2 as dra_v1
from services.proto_gen.kubelet.dra.v1beta1 import api_pb2 as dra_v1beta1
from services.proto_gen.kubelet.drahealth.v1 import api_pb2 as health_v1
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from services.proto_gen.kubelet.pluginregistration.v1 import api_pb2 as registration_v1

REPO = Path(__file__).resolve().parents[3]

Messages = dict[str, dict[str, tuple[int, str]]]
Methods = dict[str, tuple[str, str, bool]]


DRA_MESSAGES: Messages = {
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
    "NodePrepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodePrepareResourcesResponse": {
        "claims": (1, "map<string, NodePrepareResourceResponse>"),
    },
    "NodePrepareResourceResponse": {"devices": (1, "repeated Device"), "error": (2, "string")},
    "Device": {
        "request_names": (1, "repeated string"),
        "pool_name": (2, "string"),
        "device_name": (3, "string"),
        "cdi_device_ids": (4, "repeated string"),
        "share_id": (5, "optional string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "repeated Claim")},
    "NodeUnprepareResourcesResponse": {
        "claims": (1, "map<string, NodeUnprepareResourceResponse>"),
    },
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
}
DRA_METHODS: Methods = {
    "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse", False),
    "NodeUnprepareResources": (
        "NodeUnprepareResourcesRequest",
        "NodeUnprepareResourcesResponse",
        False,
    ),
}


def _without_share_id(messages: Messages) -> Messages:
    out = {name: dict(fields) for name, fields in messages.items()}
    del out["Device"]["share_id"]
    return out


# dra-health v1 and v1alpha1: the same service and messages in two packages.
HEALTH: tuple[str, Methods, Messages] = (
    "DRAResourceHealth",
    {"NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", True)},
    {
        "NodeWatchResourcesRequest": {},
        "NodeWatchResourcesResponse": {"devices": (1, "repeated DeviceHealth")},
        "DeviceHealth": {
            "device": (1, "DeviceIdentifier"),
            "health": (2, "HealthStatus"),
            "last_updated_time": (3, "int64"),
            "health_check_timeout_seconds": (4, "int64"),
            "message": (5, "string"),
        },
        "DeviceIdentifier": {"pool_name": (1, "string"), "device_name": (2, "string")},
    },
)

# module -> (package, service, methods, messages)
CONTRACT: dict[ModuleType, tuple[str, str, Methods, Messages]] = {
    dra_v1: ("k8s.io.kubelet.pkg.apis.dra.v1", "DRAPlugin", DRA_METHODS, DRA_MESSAGES),
    dra_v1beta1: (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        "DRAPlugin",
        DRA_METHODS,
        _without_share_id(DRA_MESSAGES),
    ),
    registration_v1: (
        "pluginregistration",
        "Registration",
        {
            "GetInfo": ("InfoRequest", "PluginInfo", False),
            "NotifyRegistrationStatus": (
                "RegistrationStatus",
                "RegistrationStatusResponse",
                False,
            ),
        },
        {
            "InfoRequest": {},
            "PluginInfo": {
                "type": (1, "string"),
                "name": (2, "string"),
                "endpoint": (3, "string"),
                "supported_versions": (4, "repeated string"),
            },
            "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, "string")},
            "RegistrationStatusResponse": {},
        },
    ),
    health_v1: ("v1", *HEALTH),
    health_v1alpha1: ("v1alpha1", *HEALTH),
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
}


def describe(field: FieldDescriptor) -> str:
    """The field's type as the .proto source spells it."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = (describe(field.message_type.fields_by_name[n]) for n in ("key", "value"))
        return f"map<{key}, {value}>"
    if field.message_type is not None:
        kind = field.message_type.name
    elif field.enum_type is not None:
        kind = field.enum_type.name
    else:
        kind = _SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {kind}"
    if field.has_presence and field.message_type is None and field.containing_oneof is not None:
        return f"optional {kind}"  # proto3 `optional` is a synthetic one-field oneof
    return kind


def fields_of(message: Descriptor) -> dict[str, tuple[int, str]]:
    return {f.name: (f.number, describe(f)) for f in message.fields}


def top_level_messages(file: FileDescriptor) -> dict[str, Descriptor]:
    return dict(file.message_types_by_name)


@pytest.mark.parametrize("module", list(CONTRACT), ids=lambda m: m.DESCRIPTOR.package)
def test_package_service_and_methods(module: ModuleType) -> None:
    package, service_name, methods, _ = CONTRACT[module]
    file: FileDescriptor = module.DESCRIPTOR
    assert file.package == package
    assert list(file.services_by_name) == [service_name]
    service = file.services_by_name[service_name]
    got = {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods
    }
    assert got == methods
    assert all(not m.client_streaming for m in service.methods)


@pytest.mark.parametrize("module", list(CONTRACT), ids=lambda m: m.DESCRIPTOR.package)
def test_messages_and_field_numbers(module: ModuleType) -> None:
    _, _, _, messages = CONTRACT[module]
    got = {name: fields_of(d) for name, d in top_level_messages(module.DESCRIPTOR).items()}
    assert got == messages


@pytest.mark.parametrize("module", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
def test_health_status_values(module: ModuleType) -> None:
    enum = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_committed_stubs_are_exactly_what_generate_writes(tmp_path: Path) -> None:
    """`make proto` output is committed; regenerating must change nothing."""
    subprocess.run(
        [sys.executable, str(REPO / "proto" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = tmp_path / "services" / "proto_gen"
    committed = REPO / "services" / "proto_gen"
    assert _tree(fresh) == _tree(committed), "run `make proto` and commit the result"
    mismatch = filecmp.cmpfiles(fresh, committed, sorted(_tree(fresh)), shallow=False)[1]
    assert mismatch == [], f"generated files differ: {mismatch}; run `make proto`"


def _tree(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
