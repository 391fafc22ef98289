"""The demo's view of examples/ (services/local/demo.py): which examples hold a
ComputeDomain (they need GB200 nodes), and its CDI check for each driver's claims.

A ComputeDomain's channel claim is checked against the compute-domain driver's
spec file and CDI kind, a GPU claim against the GPU driver's; an id under the
wrong kind is a problem, not a pass.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from services.core.model import computedomain as cd
from services.local import demoexamples, demoview
from services.preparer import cdi
from services.preparer.computedomain import engine

CLAIM = "0b3c2f5e-7d3a-4a47-9f0c-1d2e3f405162"
EXAMPLE = demoexamples.EXAMPLES_DIR / "13-compute-domain-two-nodes.yaml"


def channel_view(ids: list[str]) -> demoview.PodView:
    pod = demoexamples.ExamplePod("compute-domain", "worker-0", demoexamples.RUNNING)
    channel = demoview.AllocatedDevice("channel", "gb-1", "channel-0", driver=cd.CD_DRIVER)
    claim = demoview.ClaimView("compute-domain", "worker-0-ch", CLAIM, devices=[channel])
    return demoview.PodView(
        pod, EXAMPLE.name, demoexamples.RUNNING, "gb-1", {"worker": ids}, [claim]
    )


def write_channel_spec(root: Path) -> None:
    spec = {"cdiVersion": engine.CDI_VERSION, "kind": engine.KIND,
            "devices": [{"name": f"{CLAIM}-channel-0", "containerEdits": {}}]}  # fmt: skip
    engine.spec_path(root, CLAIM).write_text(yaml.safe_dump(spec))


def test_the_compute_domain_example_names_its_domain_and_is_left_out_of_the_gpu_ones() -> None:
    example = demoexamples.load_example(EXAMPLE)
    assert example.domains == ("two-node-job",)
    assert [p.name for p in example.pods] == ["worker-0", "worker-1"]
    examples = demoexamples.load_examples()
    assert EXAMPLE.name not in {e.name for e in demoexamples.gpu_only(examples)}
    assert len(demoexamples.gpu_only(examples)) == len(examples) - 1
    assert all(not e.domains for e in demoexamples.gpu_only(examples))


def test_a_channel_claim_is_checked_against_the_compute_domain_spec(tmp_path: Path) -> None:
    write_channel_spec(tmp_path)
    good = f"{engine.KIND}={CLAIM}-channel-0"
    assert demoview.device_id(CLAIM, channel_view([]).claims[0].devices[0]) == good
    assert demoview.check_cdi(channel_view([good]), tmp_path) == []
    # The same device under the GPU driver's kind is no device of the pod's claims.
    wrong = cdi.device_id(CLAIM, "channel-0")
    assert demoview.check_cdi(channel_view([wrong]), tmp_path) == [
        f"worker: {wrong} is no device of the pod's claims"
    ]


def test_a_channel_claim_without_its_spec_file_is_a_problem(tmp_path: Path) -> None:
    good = f"{engine.KIND}={CLAIM}-channel-0"
    [problem] = demoview.check_cdi(channel_view([good]), tmp_path)
    assert "no readable CDI spec" in problem and str(engine.spec_path(tmp_path, CLAIM)) in problem


def test_a_pending_pod_is_explained_only_once_its_claims_are_seen() -> None:
    """A template's claim is made after the pod: no claim yet is not an explanation."""
    pod = demoexamples.ExamplePod("shares", "share-d", demoexamples.PENDING)
    claim = demoview.ClaimView("shares", "share-d-gpu", CLAIM)
    assert not demoview.PodView(pod, "x.yaml", "Pending", "", {}, []).ok
    assert not demoview.PodView(pod, "x.yaml", "Pending", "", {}, [claim]).ok
    claim.explanation = "gpudra allocator: no node can allocate the claim"
    assert demoview.PodView(pod, "x.yaml", "Pending", "", {}, [claim]).ok
