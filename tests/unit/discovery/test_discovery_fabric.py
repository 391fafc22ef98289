"""NVLink fabric facts: the gb200-nvl72 fleet, both NVML backends and the node's clique id."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from services.core.model import cliques, domainnode, featuregates
from services.core.model.cliques import CliqueError, node_clique_id
from services.core.model.schemas import Gpu, NodeInventory
from services.discovery import pciids
from services.discovery.backend import NotSupported
from services.discovery.fleet import FleetError, get_fleet, parse_fleet
from services.discovery.inventory import scan
from services.discovery.nvml import NvmlBackend
from services.discovery.sim import SimNvml
from services.publisher.cliquelabel import wanted_label
from services.publisher.render import render_domain_contents
from tests.helpers.nvml import FakeNvml, fake_sysfs


def test_nodes_of_one_rack_share_a_clique_and_another_rack_does_not() -> None:
    a = scan(SimNvml.boot("tray-1", get_fleet("gb200-nvl72"), 7), "tray-1").inventory
    b = scan(SimNvml.boot("tray-2", get_fleet("gb200-nvl72"), 7), "tray-2").inventory
    c = scan(SimNvml.boot("tray-1", get_fleet("gb200-nvl72"), 8), "tray-1").inventory
    assert len(a.gpus) == 4 and all(g.fabric is not None for g in a.gpus)
    assert {g.uuid for g in a.gpus}.isdisjoint({g.uuid for g in b.gpus})
    clique = node_clique_id(a.gpus)
    cluster, _, clique_id = clique.rpartition(".")
    assert clique_id == "1" and len(cluster) == 36
    assert node_clique_id(b.gpus) == clique
    assert node_clique_id(c.gpus) not in ("", clique)


@pytest.mark.parametrize("fleet", ["dgx-h100", "dgx-a100", "l4x4"])
def test_gpus_outside_a_fabric_have_no_clique(fleet: str) -> None:
    inv = scan(SimNvml.boot("n", get_fleet(fleet), 1), "n").inventory
    assert all(g.fabric is None and g.error is None for g in inv.gpus)
    assert node_clique_id(inv.gpus) == ""
    assert wanted_label(inv) is None


def test_a_hopper_gpu_outside_a_fabric_answers_as_a_real_one_and_has_no_fabric() -> None:
    """A real H100 on an HGX host (driver 580.159.04) answered the call with success,
    state NOT_SUPPORTED and a zero cluster UUID (tests/unit/realgpu/); an A100 has no
    such call."""
    sim = SimNvml.boot("n", get_fleet("dgx-h100"), 1)
    info = sim.gpu_fabric_info(0)
    assert (info.state, info.status, info.clique_id) == (0, 0, 0)
    assert info.cluster_uuid == "00000000-0000-0000-0000-000000000000"
    with pytest.raises(NotSupported):
        SimNvml.boot("n", get_fleet("dgx-a100"), 1).gpu_fabric_info(0)


def test_pynvml_backend_reads_the_same_fabric_facts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sim = SimNvml.boot("tray-1", get_fleet("gb200-nvl72"), 7)
    FakeNvml(sim).install(monkeypatch)
    real = NvmlBackend(*fake_sysfs(tmp_path, sim), pciids.builtin())
    real.init()
    from_pynvml = scan(real, "tray-1").inventory
    simulated = scan(sim, "tray-1").inventory
    assert [g.fabric for g in from_pynvml.gpus] == [g.fabric for g in simulated.gpus]
    assert node_clique_id(from_pynvml.gpus) == node_clique_id(simulated.gpus) != ""


def _with_fabric(inv: NodeInventory, index: int, **changes: object) -> list[Gpu]:
    gpus = list(inv.gpus)
    before = gpus[index].fabric
    assert before is not None
    fabric = msgspec.structs.replace(before, **changes)
    gpus[index] = msgspec.structs.replace(gpus[index], fabric=fabric)
    return gpus


def test_a_fabric_that_is_not_ready_refuses_the_node_in_strict_mode() -> None:
    inv = scan(SimNvml.boot("t", get_fleet("gb200-nvl72"), 7), "t").inventory
    gpus = _with_fabric(inv, 2, state=2)
    with pytest.raises(CliqueError, match=r"GPU 2 \(GPU-.*\): NVLink fabric state IN_PROGRESS"):
        node_clique_id(gpus)
    assert node_clique_id(gpus, strict=False) == node_clique_id(inv.gpus)
    failed = _with_fabric(inv, 0, status=999)
    with pytest.raises(CliqueError, match="status 999"):
        node_clique_id(failed)


@pytest.mark.parametrize("state", [1, 2])  # NOT_STARTED, IN_PROGRESS
def test_crash_on_nvlink_fabric_errors_decides_what_a_fabric_error_costs(state: int) -> None:
    """On (the reference's default), a GPU whose fabric did not register takes the node's
    compute-domain pool and clique label away, as the reference's plugin refuses to start
    there; off, that GPU counts as outside the fabric and the others name the clique."""
    inv = scan(SimNvml.boot("t", get_fleet("gb200-nvl72"), 7), "t").inventory
    sick = msgspec.structs.replace(inv, gpus=_with_fabric(inv, 1, state=state))
    on = featuregates.parse("")
    off = featuregates.parse("CrashOnNVLinkFabricErrors=false")
    assert render_domain_contents(sick, on) is None
    assert "(CrashOnNVLinkFabricErrors): GPU 1 (GPU-" in domainnode.refusal(sick, on)
    assert domainnode.refusal(inv, on) == domainnode.refusal(sick, off) == ""
    assert wanted_label(sick, strict=True) is None
    healthy = render_domain_contents(inv, on)
    assert healthy is not None and [d.name for d in healthy[0].devices or []] == [
        "channel-0",
        "daemon-0",
    ]
    assert render_domain_contents(sick, off) == healthy
    assert wanted_label(sick, strict=False) == node_clique_id(inv.gpus)
    # Every GPU unregistered, gate off: the node is outside a fabric (no clique, pool kept).
    gpus = list(inv.gpus)
    for i in range(len(gpus)):
        gpus = _with_fabric(msgspec.structs.replace(inv, gpus=gpus), i, state=state)
    none_registered = msgspec.structs.replace(inv, gpus=gpus)
    assert wanted_label(none_registered, strict=False) is None
    assert render_domain_contents(none_registered, off) == healthy
    assert render_domain_contents(none_registered, on) is None


def test_gpus_in_two_cliques_are_refused_and_lose_the_label() -> None:
    inv = scan(SimNvml.boot("t", get_fleet("gb200-nvl72"), 7), "t").inventory
    gpus = _with_fabric(inv, 3, clique_id=2)
    with pytest.raises(
        CliqueError, match=r"more than one NVLink clique: .*\.1 on GPUs \[0, 1, 2\]"
    ):
        node_clique_id(gpus)
    two = msgspec.structs.replace(inv, gpus=gpus)
    assert wanted_label(two) is None
    assert wanted_label(inv) == node_clique_id(inv.gpus)
    # The reference's plugin refuses such a node whatever CrashOnNVLinkFabricErrors says.
    for spec in ("", "CrashOnNVLinkFabricErrors=false"):
        assert render_domain_contents(two, featuregates.parse(spec)) is None


def test_a_zero_cluster_uuid_is_no_clique() -> None:
    inv = scan(SimNvml.boot("t", get_fleet("gb200-nvl72"), 7), "t").inventory
    gpus = list(inv.gpus)
    for i in range(len(gpus)):
        gpus = _with_fabric(
            msgspec.structs.replace(inv, gpus=gpus),
            i,
            cluster_uuid="00000000-0000-0000-0000-000000000000",
        )
    assert node_clique_id(gpus) == ""


def test_a_fleet_with_a_bad_clique_id_is_refused() -> None:
    text = """
name: x
description: x
driver_version: 570.158.01
cuda_driver_version: "12.8"
nvlink_fabric: {clique_id: -1}
gpus:
  - {model: GB200, pci_bus_id: "0008:01:00.0", iommu_group: 1}
"""
    with pytest.raises(FleetError, match=r"nvlink_fabric\.clique_id: want a uint32"):
        parse_fleet("x.yaml", text)
    with pytest.raises(FleetError, match="unknown field"):
        parse_fleet("x.yaml", text.replace("clique_id: -1", "clique: 1"))


def test_the_label_key_is_gfds() -> None:
    assert cliques.GPU_CLIQUE_LABEL == "nvidia.com/gpu.clique"


def test_dns_names_refuse_a_fabric_node_whose_driver_is_too_old() -> None:
    """IMEXDaemonsWithDNSNames needs driver 570.158.01 (the reference's plugin refuses to
    start below it): a fabric node with an older one gets no compute-domain pool and
    its claims are refused, unless the gate is off. A node outside a fabric runs no
    IMEX, so its driver does not matter."""
    inv = scan(SimNvml.boot("t", get_fleet("gb200-nvl72"), 7), "t").inventory
    assert inv.driver_version == "570.158.01"
    on = featuregates.parse("")
    off = featuregates.parse("IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false")
    assert domainnode.refusal(inv, on) == ""
    for version in ("570.124.06", "565.57.01", "570.158", ""):
        old = msgspec.structs.replace(inv, driver_version=version)
        why = domainnode.refusal(old, on)
        assert why.startswith("IMEXDaemonsWithDNSNames needs NVIDIA driver 570.158.01 or later")
        assert f"the node has {version or 'none'}; set IMEXDaemonsWithDNSNames=false (and " in why
        assert render_domain_contents(old, on) is None
        assert domainnode.refusal(old, off) == "" and render_domain_contents(old, off)
    newer = msgspec.structs.replace(inv, driver_version="580.95.05")
    assert domainnode.refusal(newer, on) == ""
    plain = scan(SimNvml.boot("t", get_fleet("dgx-h100"), 7), "t").inventory
    assert plain.driver_version == "570.124.06" and domainnode.refusal(plain, on) == ""
