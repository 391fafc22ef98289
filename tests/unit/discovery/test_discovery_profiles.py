"""The GPU model tables against NVIDIA's published MIG tables."""

from __future__ import annotations

import pytest

from services.discovery.models import MIB, ModelError, get_model, model_names, parse_model
from services.discovery.nvml import profile_name

# (name, GI profile id, compute slices, placement starts, placement size) per model,
# from the MIG User Guide tables and `nvidia-smi mig -lgip` / `-lgipp`.
PUBLISHED = {
    "A100-SXM4-40GB": [
        ("1g.5gb", 19, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.5gb+me", 20, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.10gb", 15, 1, [0, 2, 4, 6], 2),
        ("2g.10gb", 14, 2, [0, 2, 4], 2),
        ("3g.20gb", 9, 3, [0, 4], 4),
        ("4g.20gb", 5, 4, [0], 4),
        ("7g.40gb", 0, 7, [0], 8),
    ],
    "A100-SXM4-80GB": [
        ("1g.10gb", 19, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.10gb+me", 20, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.20gb", 15, 1, [0, 2, 4, 6], 2),
        ("2g.20gb", 14, 2, [0, 2, 4], 2),
        ("3g.40gb", 9, 3, [0, 4], 4),
        ("4g.40gb", 5, 4, [0], 4),
        ("7g.80gb", 0, 7, [0], 8),
    ],
    "H100-SXM5-80GB": [
        ("1g.10gb", 19, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.10gb+me", 20, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.20gb", 15, 1, [0, 2, 4, 6], 2),
        ("2g.20gb", 14, 2, [0, 2, 4], 2),
        ("3g.40gb", 9, 3, [0, 4], 4),
        ("4g.40gb", 5, 4, [0], 4),
        ("7g.80gb", 0, 7, [0], 8),
    ],
    "H200-141GB": [
        ("1g.18gb", 19, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.18gb+me", 20, 1, [0, 1, 2, 3, 4, 5, 6], 1),
        ("1g.35gb", 15, 1, [0, 2, 4, 6], 2),
        ("2g.35gb", 14, 2, [0, 2, 4], 2),
        ("3g.71gb", 9, 3, [0, 4], 4),
        ("4g.71gb", 5, 4, [0], 4),
        ("7g.141gb", 0, 7, [0], 8),
    ],
}

# (SMs, copy engines, NVDECs, JPEGs, OFAs) per profile, in the order above.
ENGINES = {
    "A100-SXM4-40GB": [
        (14, 1, 0, 0, 0),
        (14, 1, 1, 1, 1),
        (14, 1, 1, 0, 0),
        (28, 2, 1, 0, 0),
        (42, 3, 2, 0, 0),
        (56, 4, 2, 0, 0),
        (98, 7, 5, 1, 1),
    ],
    "H100-SXM5-80GB": [
        (16, 1, 1, 1, 0),
        (16, 1, 1, 1, 1),
        (26, 1, 1, 1, 0),
        (32, 2, 2, 2, 0),
        (60, 3, 3, 3, 0),
        (64, 4, 4, 4, 0),
        (132, 8, 7, 7, 1),
    ],
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_profiles_match_published_tables(model: str) -> None:
    mig = get_model(model).mig
    assert mig is not None
    got = [(p.name, p.id, p.slices, p.starts, p.size) for p in mig.profiles]
    assert got == PUBLISHED[model]


@pytest.mark.parametrize("model", sorted(ENGINES))
def test_engine_and_sm_counts(model: str) -> None:
    mig = get_model(model).mig
    assert mig is not None
    got = [
        (p.multiprocessors, p.copy_engines, p.decoders, p.jpeg_engines, p.ofa_engines)
        for p in mig.profiles
    ]
    assert got == ENGINES[model]
    assert all(p.encoders == 0 for p in mig.profiles)  # no NVENC on A100/H100


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_names_follow_from_memory_like_go_nvlib(model: str) -> None:
    """Each name's "Ngb" is what go-nvlib derives from the MiB and the GPU's memory."""
    m = get_model(model)
    assert m.mig is not None
    for p in m.mig.profiles:
        derived = profile_name(None, p.slices, p.memory_mib, m.memory_mib * MIB, p.nvml_profile)
        assert derived == p.name, (p.name, p.memory_mib)


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_counts_and_whole_gpu_profile(model: str) -> None:
    mig = get_model(model).mig
    assert mig is not None
    assert (mig.memory_slices, mig.compute_slices) == (8, 7)
    by_name = {p.name.split(".")[0]: p for p in mig.profiles}
    whole = by_name["7g"]
    assert whole.size == mig.memory_slices and whole.instances == 1
    assert {p.instances for p in mig.profiles if p.slices == 1 and p.size == 1} == {7, 1}
    assert [p.instances for p in mig.profiles if p.size == 2] == [4, 3]
    # the memory of a profile never exceeds the GPU's
    assert all(p.memory_mib <= get_model(model).memory_mib for p in mig.profiles)


def test_l4_has_no_mig_and_model_list() -> None:
    assert get_model("L4").mig is None
    assert get_model("L4").architecture == "Ada Lovelace"
    assert model_names() == [
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "GB200",
        "H100-SXM5-80GB",
        "H200-141GB",
        "L4",
    ]
    with pytest.raises(ModelError, match=r"unknown GPU model 'B300'.*H100-SXM5-80GB"):
        get_model("B300")


BASE = """
model: X
product_name: X
brand: Nvidia
architecture: Hopper
cuda_compute_capability: [9, 0]
memory_mib: 1000
pci_device_id: 1
addressable_memory_mib: 1
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("bogus: 1\n", "unknown field `bogus`"),
        ("mig: {memory_slices: 8, compute_slices: 7, profiles: [{name: a}]}\n", "missing required"),
        (
            "mig:\n  memory_slices: 8\n  compute_slices: 7\n  profiles:\n"
            "  - {name: 2g, nvml_profile: 1, id: 14, ci_profile: 1, slices: 2, memory_mib: 1,"
            " multiprocessors: 1, copy_engines: 1, decoders: 0, encoders: 0, jpeg_engines: 0,"
            " ofa_engines: 0, instances: 1, size: 2, starts: [1]}\n",
            "placement 1:2 does not fit",
        ),
    ],
)
def test_bad_model_tables_say_which_field(extra: str, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        parse_model("x.yaml", BASE + extra)
