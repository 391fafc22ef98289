"""Quantity and Semver as typed CEL values: protobuf messages built at import time.

cel-expr-python evaluates in C++; custom types reach it as protobuf messages.
Each message holds only what equality must compare, because CEL's ``==`` on
messages compares fields and cannot be overloaded: a Quantity is its exact
value in nano units (so ``quantity("1Gi") == quantity("1024Mi")``), a Semver
its major/minor/patch/pre-release (build metadata does not count, as in
blang/semver's ``Compare``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from services.allocator.cel.semver import Semver
from services.core.kube.quantity import Quantity

PACKAGE = "gpudra.cel"
QUANTITY_TYPE = f"{PACKAGE}.Quantity"
SEMVER_TYPE = f"{PACKAGE}.Semver"
# The network and URL libraries' types, by the names Kubernetes gives them.
IP_TYPE = "net.IP"
CIDR_TYPE = "net.CIDR"
URL_TYPE = "kubernetes.URL"
# The format library's type (formatlib.py); it holds the format's name.
FORMAT_TYPE = "kubernetes.NamedFormat"

_F = descriptor_pb2.FieldDescriptorProto


def _build_pool() -> descriptor_pool.DescriptorPool:
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpudra/cel_types.proto", package=PACKAGE, syntax="proto3"
    )
    quantity = proto.message_type.add(name="Quantity")
    quantity.field.add(name="nanos", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    semver = proto.message_type.add(name="Semver")
    for number, name in enumerate(("major", "minor", "patch"), start=1):
        semver.field.add(name=name, number=number, type=_F.TYPE_UINT64, label=_F.LABEL_OPTIONAL)
    semver.field.add(name="pre", number=4, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    for package, names in (("net", ("IP", "CIDR")), ("kubernetes", ("URL", "NamedFormat"))):
        texts = descriptor_pb2.FileDescriptorProto(
            name=f"gpudra/cel_{package}.proto", package=package, syntax="proto3"
        )
        for name in names:
            message = texts.message_type.add(name=name)
            message.field.add(name="text", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
        pool.Add(texts)
    return pool


POOL = _build_pool()
QuantityMessage: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName(QUANTITY_TYPE))
SemverMessage: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName(SEMVER_TYPE))
IPMessage: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName(IP_TYPE))
CIDRMessage: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName(CIDR_TYPE))
URLMessage: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName(URL_TYPE))
FormatMessage: Any = message_factory.GetMessageClass(POOL.FindMessageTypeByName(FORMAT_TYPE))


def quantity_message(value: Quantity) -> Any:
    return QuantityMessage(nanos=str(value.nanos()))


@lru_cache(maxsize=4096)
def _quantity_from_nanos(nanos: str) -> Quantity:
    """The value back as a Quantity, whole numbers in Go's int64 form.

    Only the value crosses into CEL, so ``isInteger``/``asInteger`` see Go's
    result for the canonical spelling of the value: exact for capacities (the
    API server stores canonical strings), generous for a non-canonical literal
    such as ``quantity("1000m")``, which Go would call non-integer.
    """
    value = int(nanos)
    whole, fraction = divmod(value, 10**9)
    return Quantity(whole, 0) if fraction == 0 else Quantity(value, -9)


def quantity_of(message: Any) -> Quantity:
    return _quantity_from_nanos(message.nanos)


def semver_message(value: Semver) -> Any:
    return SemverMessage(
        major=value.major, minor=value.minor, patch=value.patch, pre=value.pre_text()
    )


def semver_of(message: Any) -> Semver:
    pre: tuple[int | str, ...] = ()
    if message.pre:
        pre = tuple(int(p) if p.isdigit() else p for p in message.pre.split("."))
    return Semver(message.major, message.minor, message.patch, pre)
