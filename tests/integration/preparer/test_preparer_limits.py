"""A request naming more claims than any real pod is refused whole, before any work.

An attacker (or a bug) naming 2,000 unknown claims once cost 8.2 s, 2,000 API
lookups and 4,000 events; now it costs one reply and a log line, and the next
honest request is served as usual.
"""

from __future__ import annotations

import pytest

from services.core.kit.limits import MAX_CLAIMS_PER_REQUEST
from services.core.model.schemas import ClaimRef
from tests.helpers.events import stored_claim_events
from tests.helpers.preparer import Dev, Node, make_claim, new_uid, ref

pytestmark = pytest.mark.integration


async def test_a_request_naming_2000_claims_is_refused_whole(node: Node) -> None:
    await node.start_preparer()
    flood = [ClaimRef(uid=new_uid(), namespace="ns", name=f"c{i}") for i in range(2000)]
    reply = await node.request("prepare", flood, timeout=10)
    assert set(reply.claims) == {c.uid for c in flood}
    errors = {r.error for r in reply.claims.values()}
    assert errors == {
        f"prepare refused: the request names 2000 claims; gpudra takes at most "
        f"{MAX_CLAIMS_PER_REQUEST} in one kubelet call"
    }
    flooded = {c.uid for c in flood}
    assert not [e for e in await stored_claim_events(node.bus) if e.claim.uid in flooded]

    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")], name="honest"))
    honest = await node.prepare(claim)
    assert honest.claims[ref(claim).uid].error == ""
