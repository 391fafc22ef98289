"""Each identity's payload limit holds its largest real message, with room.

The messages are rebuilt with the longest names the API allows (services/core/bus/
payloads.py lists the sizes): if one grows past its role's limit with less than half
again to spare, the limit (or the message) has to be looked at again.
"""

from __future__ import annotations

import uuid

import pytest

from services.core.bus import payloads, retention, subjects
from services.core.bus.access import Role
from services.core.model.schemas import (
    ClaimEvent,
    ClaimRef,
    ClaimResult,
    DeviceRef,
    DomainMember,
    DomainStatusEvent,
    NodeReply,
    NodeRequest,
    PodRef,
    PreparedDevice,
    encode,
)
from services.discovery import inventory
from services.discovery.fleet import get_fleet
from services.discovery.sim import SimNvml

NODE, NAME, NS = "x" * 253, "c" * 253, "n" * 63
HEADROOM = 1.5


def _claims(count: int) -> list[ClaimRef]:
    return [ClaimRef(uid=str(uuid.uuid4()), namespace=NS, name=NAME) for _ in range(count)]


def _request() -> bytes:
    claims = _claims(512)
    parents = {c.uid: f"00-{'a' * 32}-{'b' * 16}-01" for c in claims}
    return encode(NodeRequest(node=NODE, claims=claims, deadline=1e9, traceparents=parents))


def _device(uid: str, i: int) -> PreparedDevice:
    return PreparedDevice(
        request_names=["r" * 63], pool_name=NODE, device_name=f"gpu-{i}-mig-1g10gb-19-0",
        cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={uid}-gpu-{i}", "k8s.gpu.nvidia.com/gpu=all"],
        share_id=str(uuid.uuid4()),
    )  # fmt: skip


def _reply() -> bytes:
    results = {c.uid: ClaimResult(devices=[_device(c.uid, 0)]) for c in _claims(512)}
    return encode(NodeReply(claims=results))


def _inventory() -> bytes:
    """An 8-GPU node with every GPU cut into its smallest MIG devices (56 of them)."""
    sim = SimNvml.boot("node", get_fleet("dgx-h100"), 0)
    sim.init()
    for gpu in range(sim.device_count()):
        sim.set_mig_mode(gpu, True)
        smallest = min(sim.gpu_instance_profiles(gpu), key=lambda p: p.slices)
        for _ in range(7):
            gi, _ = sim.create_gpu_instance(gpu, smallest.id, None)
            sim.create_compute_instance(gpu, gi)
    scanned = inventory.scan(sim, NODE, None).inventory
    assert sum(len(g.mig_devices) for g in scanned.gpus) == 56
    return encode(scanned)


def _reserved() -> bytes:
    pods = [PodRef(name="p" * 253, uid=str(uuid.uuid4())) for _ in range(256)]
    return encode(ClaimEvent(event="reserved", claim=_claims(1)[0], node=NODE,
                             actor="allocator", pods=pods))  # fmt: skip


def _prepared() -> bytes:
    cdi = ["k8s.gpu.nvidia.com/claim=x"]
    devices = [DeviceRef(request="r" * 63, pool=NODE, device=f"gpu-{i}", gpu_uuid="GPU-x",
                         cdi_device_ids=cdi) for i in range(32)]  # fmt: skip
    return encode(ClaimEvent(event="prepared", claim=_claims(1)[0], node=NODE,
                             actor="preparer", devices=devices))  # fmt: skip


def _status() -> bytes:
    return encode(DomainStatusEvent(domain_uid=str(uuid.uuid4()), namespace=NS, name=NAME,
                                    status="Ready", ready_nodes=[NODE] * 18))  # fmt: skip


def _member() -> bytes:
    member = DomainMember(domain_uid=str(uuid.uuid4()), node=NODE, ip_address="1.2.3.4",
                          clique_id="c" * 80, reason="r" * 1000, pod=f"{NS}/{NAME}")  # fmt: skip
    return encode(member)


CASES = [
    (Role.FRONT, _request),
    (Role.PREPARER, _reply),
    (Role.PREPARER, _prepared),
    (Role.DISCOVERY, _inventory),
    (Role.ALLOCATOR, _reserved),
    (Role.DOMAINS, _status),
    (Role.IMEX, _member),
]


@pytest.mark.parametrize(("role", "build"), CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_the_largest_real_message_fits_with_room(role: Role, build: object) -> None:
    assert callable(build)
    need = len(build())
    assert need * HEADROOM <= payloads.limit(role), f"{need} bytes"


@pytest.mark.parametrize(
    ("role", "written"),
    [
        (Role.ALLOCATOR, subjects.CLAIMS_BUCKET),
        (Role.PREPARER, subjects.PREPARED_BUCKET),
        (Role.PREPARER, subjects.CLAIMS_STREAM),
        (Role.IMEX, subjects.DOMAINS_BUCKET),
        (Role.DOMAINS, subjects.DOMAINS_BUCKET),
    ],
)
def test_a_writer_may_send_what_its_bucket_or_stream_takes(role: Role, written: str) -> None:
    """A limit under the store's own would refuse values the store takes."""
    assert retention.limits(written).max_msg_size + 1024 <= payloads.limit(role)


def test_the_size_counts_headers_as_the_server_does() -> None:
    assert payloads.size(b"abc", None) == 3
    assert payloads.size(b"abc", {"A": "b"}) == 3 + len(b"NATS/1.0\r\nA: b\r\n\r\n")
    with pytest.raises(payloads.PayloadTooLarge, match="imex-daemon may publish 16384"):
        payloads.check(Role.IMEX, "$KV.domains.k", b"x" * (16 * 1024 + 1))
    payloads.check(Role.IMEX, "$KV.domains.k", b"x" * (16 * 1024))
