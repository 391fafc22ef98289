"""A checkpoint of any shape on disk at start: the real preparer quarantines it and serves.

A checkpoint nested 100,000 deep once crash-looped the preparer: msgspec (and the
json module that splits the reference's file) raise RecursionError past about
1,000 levels, also in members they skip, and start-up let it out. Now the file
is set aside as checkpoint.json.bad-<time>, the reason is logged, and the node is
served. Every other shape is tried without a process in
tests/unit/preparer/test_checkpoint_hostile.py.
"""

from __future__ import annotations

import pytest

from services.preparer import checkpointfile
from tests.helpers.preparer import Dev, Node, make_claim, ref

pytestmark = pytest.mark.integration

DEPTH = 100_000


def _ours_deep() -> bytes:
    """Our format, checksum right, its data a list 100,000 deep."""
    return checkpointfile.envelope(
        b'{"claims":{"u":{"groups":' + b"[" * DEPTH + b"]" * DEPTH + b"}}}"
    )


def _ours_deep_unknown_field() -> bytes:
    """Our format with an unknown member 100,000 deep, before the checksum is even read."""
    return b'{"version":1,"x":' + b'{"a":' * DEPTH + b"1" + b"}" * DEPTH + b',"data":{}}'


def _reference_deep() -> bytes:
    """The reference driver's shape (a numeric checksum first), its v2 100,000 deep."""
    return b'{"checksum":1,"v2":' + b"[" * DEPTH + b"]" * DEPTH + b"}"


@pytest.mark.parametrize(
    "shape", [_ours_deep, _ours_deep_unknown_field, _reference_deep], ids=lambda f: f.__name__
)
async def test_a_checkpoint_100000_deep_is_quarantined_and_the_node_served(
    node: Node, shape
) -> None:
    bad = shape()
    node.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    node.checkpoint_path.write_bytes(bad)

    preparer = await node.start_preparer()  # ready: it answers; no crash loop

    log = preparer.output()
    assert "CHECKPOINT NOT TRUSTED" in log and "nested too deeply" in log, log[-3000:]
    [quarantined] = sorted(node.checkpoint_path.parent.glob("checkpoint.json.bad-*"))
    assert quarantined.read_bytes() == bad
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")], name="after"))
    reply = await node.prepare(claim)
    assert reply.claims[ref(claim).uid].error == ""
    assert list(node.checkpoint().claims) == [ref(claim).uid]
