"""Reading a claim while the ``claims`` bucket cannot answer: tried again until shortly
before the kubelet's deadline, then a clear error. The bus is replaced by a fake here;
tests/integration/core/test_bus_cluster.py loses the real cluster's quorum."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import BadRequestError, ServiceUnavailableError

from services.core.bus.client import Bus
from services.core.model.schemas import ClaimRef
from services.preparer.claims import ClaimError, ClaimSource, patience
from tests.helpers.preparer import Dev, make_claim

UID = "0b7f4a48-7d6e-4c1b-9a55-3d2f8c1e6a90"


@dataclass
class Bucket:
    """kv_get raises ``errors`` one by one, then answers with ``value``."""

    errors: list[Exception] = field(default_factory=list)
    value: Any = None
    gets: int = 0

    async def kv_get(self, bucket: str, key: str, kind: type) -> tuple[Any, int] | None:
        self.gets += 1
        if self.errors:
            raise self.errors.pop(0)
        return (self.value, 1) if self.value is not None else None


def ref() -> ClaimRef:
    return ClaimRef(uid=UID, namespace="default", name="claim")


async def test_a_bucket_electing_a_leader_is_read_again() -> None:
    claim = make_claim("n1", [Dev("gpu", "gpu-0")], uid=UID)
    bucket = Bucket(errors=[ServiceUnavailableError(code=503), NatsTimeoutError()], value=claim)
    source = ClaimSource(cast(Bus, bucket), "n1", trust_bucket=True)
    assert await source.get(ref(), deadline=time.time() + 30) == claim
    assert bucket.gets == 3


async def test_a_bucket_without_quorum_fails_the_claim_before_the_deadline() -> None:
    bucket = Bucket(errors=[ServiceUnavailableError(code=503)] * 1000)
    source = ClaimSource(cast(Bus, bucket), "n1", trust_bucket=True)
    started = time.monotonic()
    with pytest.raises(ClaimError) as failed:
        await source.get(ref(), deadline=time.time() + 1.5)
    assert time.monotonic() - started < 1.5
    assert "claim default/claim: the claims bucket cannot be read" in str(failed.value)
    assert "lost its quorum" in str(failed.value)


async def test_a_refused_read_is_not_tried_again() -> None:
    bucket = Bucket(errors=[BadRequestError(code=400, description="bad key")])
    with pytest.raises(BadRequestError):
        await ClaimSource(cast(Bus, bucket), "n1", trust_bucket=True).get(
            ref(), deadline=time.time() + 30
        )
    assert bucket.gets == 1


def test_patience_leaves_time_for_the_answer() -> None:
    assert patience(None) == 5.0
    assert patience(time.time() + 44.5) == pytest.approx(40.05, abs=0.1)
    assert patience(time.time() + 1.0) == pytest.approx(0.75, abs=0.05)
    assert patience(time.time() - 1) == 0.0
