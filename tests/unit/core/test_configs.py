"""Opaque configs: strict decoding, normalisation, validation, gates and precedence."""

from __future__ import annotations

import re
from typing import Any

import pytest

from services.core.kube.resource import DeviceRequestAllocationResult
from services.core.model import configs
from services.core.model import featuregates as fg
from services.core.model.configs import ConfigError
from tests.helpers.preparer import opaque

API = "resource.nvidia.com/v1beta1"
ALL_SHARING = fg.parse("MPSSupport=true,TimeSlicingSettings=true")
ORIGIN = "config[1] (FromClaim)"


def gpu(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **({"sharing": sharing} if sharing else {})}


def check(params: dict[str, Any], gates: fg.FeatureGates = ALL_SHARING) -> configs.DeviceConfig:
    config = configs.normalize(configs.decode(params, ORIGIN), gates)
    configs.validate(config, ORIGIN, gates)
    return config


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "config[1] (FromClaim): unsupported apiVersion 'resource.nvidia.com/v1'; "
            "expected resource.nvidia.com/v1beta1",
        ),
        (
            {"apiVersion": API, "kind": "TpuConfig"},
            "config[1] (FromClaim): unknown kind 'TpuConfig'; expected one of GpuConfig, "
            "MigDeviceConfig, VfioDeviceConfig",
        ),
        (
            gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentag": 10}),
            "config[1] (FromClaim) GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentag: "
            "unknown field",
        ),
        ({**gpu(), "metadata": {}}, "config[1] (FromClaim) GpuConfig.metadata: unknown field"),
        (
            {
                "apiVersion": API,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
            },
            "config[1] (FromClaim) MigDeviceConfig.sharing.timeSlicingConfig: unknown field",
        ),
        (
            gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": "50"}),
            "GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: expected `int | null`, "
            "got `str`",
        ),
        ("not an object", "config[1] (FromClaim): parameters must be an object, got str"),
    ],
)
def test_decoding_is_strict_and_names_the_field(params: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        configs.decode(params, ORIGIN)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("params", "gates", "message"),
    [
        (
            gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 150}),
            ALL_SHARING,
            "config[1] (FromClaim) GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: "
            "must be between 0 and 100, got 150",
        ),
        (
            gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": -1}),
            ALL_SHARING,
            "defaultActiveThreadPercentage: must be between 0 and 100, got -1",
        ),
        (
            gpu(strategy="TimeSlicing", mpsConfig={}),
            ALL_SHARING,
            "GpuConfig.sharing.mpsConfig: not allowed with strategy TimeSlicing",
        ),
        (
            gpu(strategy="MPS", timeSlicingConfig={"interval": "Long"}),
            ALL_SHARING,
            "GpuConfig.sharing.timeSlicingConfig: not allowed with strategy MPS",
        ),
        (
            gpu(strategy="MPS"),
            fg.parse("TimeSlicingSettings=true"),
            'GpuConfig.sharing.strategy: "MPS" is selected as the GPU sharing strategy, '
            'but the "MPSSupport" feature gate is not enabled',
        ),
        (
            gpu(strategy="TimeSlicing"),
            fg.parse(""),
            'but the "TimeSlicingSettings" feature gate is not enabled',
        ),
        (
            gpu(strategy="Exclusive"),
            ALL_SHARING,
            "GpuConfig.sharing.strategy: unknown GPU sharing strategy 'Exclusive'; "
            "valid: TimeSlicing, MPS",
        ),
        (
            gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "Forever"}),
            ALL_SHARING,
            "timeSlicingConfig.interval: unknown time-slice interval 'Forever'; "
            "valid: Default, Short, Medium, Long",
        ),
        (
            gpu(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "-1Gi"}),
            ALL_SHARING,
            "mpsConfig.defaultPinnedDeviceMemoryLimit: must be greater than zero, got -1Gi",
        ),
        (
            gpu(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "512Ki"}),
            ALL_SHARING,
            "defaultPinnedDeviceMemoryLimit: must be at least 1Mi, got 512Ki",
        ),
        (
            gpu(strategy="MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}}),
            ALL_SHARING,
            "mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: 'lots' is not a quantity",
        ),
        (
            {"apiVersion": API, "kind": "VfioDeviceConfig"},
            ALL_SHARING,
            'VfioDeviceConfig: needs the "PassthroughSupport" feature gate, which is not enabled',
        ),
        (
            {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "Any"}},
            fg.parse("PassthroughSupport=true"),
            "VfioDeviceConfig.iommu.backendPolicy: unknown IOMMU backend policy 'Any'; "
            "valid: LegacyOnly, PreferIommuFD",
        ),
    ],
)
def test_validation_names_the_field_and_the_rule(
    params: dict[str, Any], gates: fg.FeatureGates, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        check(params, gates)
    assert message in str(err.value)


# ------------------------------------------------------------------ the reference's reading
#
# Configs the reference accepts and gpudra once refused: each is read here as the
# reference's decoder (k8s.io/apimachinery JSON, resource.Quantity, strconv.Atoi)
# reads it. Those gpudra still refuses on purpose are the next section, each with
# its row in docs/differences.md.


def test_a_memory_limit_is_read_as_resource_quantity_reads_json() -> None:
    """Quantity.UnmarshalJSON parses a JSON number's text however it is written and
    trims the blanks around a string (api/nvidia.com/resource/v1beta1/sharing.go)."""
    mps = check(
        gpu(strategy="MPS", mpsConfig={
            "defaultPinnedDeviceMemoryLimit": 1.5e9,
            "defaultPerDevicePinnedMemoryLimit": {"0": 1073741824.0, "GPU-b": " 2Gi "},
        })
    )  # fmt: skip
    assert isinstance(mps, configs.GpuConfig) and mps.sharing and mps.sharing.mps_config
    limits = configs.per_device_limits(mps.sharing.mps_config, ["GPU-a", "GPU-b", "GPU-c"], "x")
    assert limits == {"GPU-a": 1024, "GPU-b": 2048, "GPU-c": 1430}
    with pytest.raises(ConfigError, match=r"defaultPinnedDeviceMemoryLimit: must be at least 1Mi"):
        check(gpu(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": 2.5}))
    with pytest.raises(
        ConfigError, match=r"defaultPinnedDeviceMemoryLimit: expected `int \| float"
    ):
        check(gpu(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": True}))


def test_a_per_device_index_is_read_as_strconv_atoi_reads_it() -> None:
    by_index = configs.MpsConfig(default_per_device_pinned_memory_limit={"+1": "2Gi", "-0": "1Gi"})
    assert configs.per_device_limits(by_index, ["GPU-b", "GPU-a"], "x") == {
        "GPU-a": 1024,
        "GPU-b": 2048,
    }
    for key in ["1.0", " 1", "0x1", "1_0", "-1", "2"]:
        bad = configs.MpsConfig(default_per_device_pinned_memory_limit={key: "1Gi"})
        with pytest.raises(ConfigError, match="not a UUID or index"):
            configs.per_device_limits(bad, ["GPU-a", "GPU-b"], "x")


def test_a_null_backend_policy_is_unset_as_in_go() -> None:
    vfio = check(
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": None}},
        fg.parse("PassthroughSupport=true"),
    )
    assert vfio == configs.VfioDeviceConfig(
        iommu=configs.IommuConfig(backend_policy="LegacyOnly", enable_api_device=False)
    )


# Refused on purpose where the reference accepts (docs/differences.md says why).

MIG_TS_WITH_MPS = {
    "apiVersion": API,
    "kind": "MigDeviceConfig",
    "sharing": {"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercentage": 10}},
}


def test_a_mig_time_slicing_config_with_an_mps_config_is_refused() -> None:
    """The reference ignores the mpsConfig here (MigDeviceSharing.GetTimeSlicingConfig),
    though it refuses the same shape in a GpuConfig."""
    with pytest.raises(ConfigError) as err:
        check(MIG_TS_WITH_MPS)
    assert str(err.value) == (
        "config[1] (FromClaim) MigDeviceConfig.sharing.mpsConfig: "
        "not allowed with strategy TimeSlicing"
    )


def test_a_config_that_applies_to_no_device_is_still_validated() -> None:
    """The reference only decodes a config no device takes; gpudra judges each one."""
    overridden = opaque(gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "Fast"}))
    winner = opaque(gpu())
    elsewhere = opaque(gpu(strategy="MPS"), requests=["other"])
    unused_kind = opaque(MIG_TS_WITH_MPS)
    for bad, words in [
        (overridden, "config[0] (FromClaim) GpuConfig.sharing.timeSlicingConfig.interval"),
        (elsewhere, 'config[0] (FromClaim) GpuConfig.sharing.strategy: "MPS" is selected'),
        (unused_kind, "config[0] (FromClaim) MigDeviceConfig.sharing.mpsConfig"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(words)):
            configs.resolve(
                [bad, winner], [result("a", "gpu-0")], {"gpu-0": "gpu"},
                fg.parse("TimeSlicingSettings=true"),
            )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "gates"),
    [
        ("VfioDeviceConfig", ""),  # PassthroughSupport off: there is no VFIO device
        ("ComputeDomainChannelConfig", "PassthroughSupport=true"),  # the other driver's kinds
        ("ComputeDomainDaemonConfig", ""),
        ("ComputeDomain", ""),
    ],
)
def test_a_kind_no_device_of_this_driver_can_take_is_refused(kind: str, gates: str) -> None:
    """The reference decodes every kind of its API group for either driver and ignores
    one no device takes; gpudra refuses it whether or not it names a request."""
    params = {"apiVersion": API, "kind": kind, **({"domainID": "u"} if "Config" in kind else {})}
    with pytest.raises(ConfigError, match=r"config\[0\] \(FromClaim\)"):
        configs.resolve([opaque(params)], [result("a", "gpu-0")], {"gpu-0": "gpu"}, fg.parse(gates))


def test_normalisation_fills_the_reference_defaults() -> None:
    ts = check(gpu(strategy="TimeSlicing"))
    assert isinstance(ts, configs.GpuConfig) and ts.sharing is not None
    assert ts.sharing.time_slicing_config == configs.TimeSlicingConfig(interval="Default")
    mps = check(gpu(strategy="MPS"))
    assert isinstance(mps, configs.GpuConfig) and mps.sharing is not None
    assert mps.sharing.mps_config == configs.MpsConfig()
    vfio = check(
        {"apiVersion": API, "kind": "VfioDeviceConfig"}, fg.parse("PassthroughSupport=true")
    )
    assert vfio == configs.VfioDeviceConfig(
        iommu=configs.IommuConfig(backend_policy="LegacyOnly", enable_api_device=False)
    )


def test_memory_limits_become_whole_mib_per_device() -> None:
    mps = configs.MpsConfig(
        default_pinned_device_memory_limit="1Gi",
        default_per_device_pinned_memory_limit={"1": "1500Mi", "GPU-a": 2_000_000_000},
    )
    limits = configs.per_device_limits(mps, ["GPU-a", "GPU-b"], "x")
    assert limits == {"GPU-a": 1907, "GPU-b": 1500}
    # Indexes count in the sorted UUIDs, not in allocation order (as the reference).
    by_index = configs.MpsConfig(default_per_device_pinned_memory_limit={"0": "1Gi", "1": "2Gi"})
    in_allocation_order = ["MIG-0", "GPU-b", "GPU-a"]
    assert configs.per_device_limits(by_index, in_allocation_order, "x") == {
        "GPU-a": 1024,
        "GPU-b": 2048,
    }
    with pytest.raises(ConfigError, match=r"x\.defaultPerDevicePinnedMemoryLimit\[7\]: not a UUID"):
        configs.per_device_limits(
            configs.MpsConfig(default_per_device_pinned_memory_limit={"7": "1Gi"}), ["GPU-a"], "x"
        )


def test_a_limit_beyond_what_a_quantity_holds_is_refused() -> None:
    """99999999999999999999999Ei was accepted: a 36-digit MiB figure in the checkpoint;
    the reference's Quantity.Value() would keep its low 64 bits."""
    with pytest.raises(ConfigError) as err:
        check(
            gpu(
                strategy="MPS",
                mpsConfig={"defaultPinnedDeviceMemoryLimit": "99999999999999999999999Ei"},
            )
        )
    assert str(err.value) == (
        "config[1] (FromClaim) GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
        "99999999999999999999999Ei is more memory than any device has; a limit is at most "
        "2^63-1 bytes (just under 8Ei, what a Kubernetes quantity's value holds)"
    )
    per_device = {"defaultPerDevicePinnedMemoryLimit": {"0": 2**63}}
    with pytest.raises(
        ConfigError, match=r"defaultPerDevicePinnedMemoryLimit\[0\]: 9223372036854775808 is"
    ):
        check(gpu(strategy="MPS", mpsConfig=per_device))
    assert configs.memory_limit_mib(str(2**63 - 1), "x") == 2**43 - 1  # the most, in whole MiB


def test_a_limit_above_the_devices_memory_is_capped_to_it() -> None:
    limits, lowered = configs.capped(
        {"GPU-a": 200_000, "GPU-b": 1024, "MIG-c": 20_480},
        {"GPU-a": 81_559, "GPU-b": 81_559, "MIG-c": 9_856},
    )
    assert limits == {"GPU-a": 81_559, "GPU-b": 1024, "MIG-c": 9_856}
    assert lowered == [
        configs.Capped("GPU-a", 200_000, 81_559),
        configs.Capped("MIG-c", 20_480, 9_856),
    ]
    assert configs.capped({"GPU-x": 5}, {}) == ({"GPU-x": 5}, [])  # memory unknown: as asked


# ------------------------------------------------------------------ precedence


def result(request: str, device: str) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult(
        request=request, driver="gpu.nvidia.com", pool="n", device=device
    )


def interval_of(group: configs.ConfigGroup) -> str | None:
    assert isinstance(group.config, configs.GpuConfig)
    sharing = group.config.sharing
    if sharing is None or sharing.time_slicing_config is None:
        return None
    return sharing.time_slicing_config.interval


def ts(interval: str) -> dict[str, Any]:
    return gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": interval})


def test_claim_configs_override_class_configs_and_later_ones_win() -> None:
    groups = configs.resolve(
        [
            opaque(ts("Long"), "FromClaim"),  # listed first, but claim configs rank above class
            opaque(ts("Short"), "FromClass"),
            opaque(ts("Medium"), "FromClaim"),
        ],
        [result("a", "gpu-0")],
        {"gpu-0": "gpu"},
        ALL_SHARING,
    )
    assert [(interval_of(g), g.origin) for g in groups] == [("Medium", "config[2] (FromClaim)")]


def test_a_config_naming_requests_applies_to_those_only_and_to_their_subrequests() -> None:
    groups = configs.resolve(
        [opaque(ts("Long"), "FromClaim", requests=["b"])],
        [result("a", "gpu-0"), result("b/big", "gpu-1"), result("c", "gpu-2")],
        {"gpu-0": "gpu", "gpu-1": "gpu", "gpu-2": "gpu"},
        ALL_SHARING,
    )
    by_device = {r.device: interval_of(g) for g in groups for r in g.results}
    assert by_device == {"gpu-0": None, "gpu-1": "Long", "gpu-2": None}


def test_an_unscoped_config_skips_devices_of_another_type() -> None:
    mig_config = {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    groups = configs.resolve(
        [opaque(mig_config)],
        [result("a", "gpu-0"), result("b", "gpu-1-mig-1g10gb-19-0")],
        {"gpu-0": "gpu", "gpu-1-mig-1g10gb-19-0": "mig"},
        ALL_SHARING,
    )
    kinds = {r.device: g.config.kind for g in groups for r in g.results}
    assert kinds == {"gpu-0": "GpuConfig", "gpu-1-mig-1g10gb-19-0": "MigDeviceConfig"}


def test_a_config_for_the_wrong_device_type_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        configs.resolve(
            [opaque(gpu(), requests=["m"])],
            [result("m", "gpu-1-mig-1g10gb-19-0")],
            {"gpu-1-mig-1g10gb-19-0": "mig"},
            ALL_SHARING,
        )
    assert str(err.value) == (
        "config[0] (FromClaim) GpuConfig: cannot apply to device 'gpu-1-mig-1g10gb-19-0' "
        "of type mig (request 'm')"
    )


MIG_NAME = "gpu-1-mig-1g10gb-19-0"


@pytest.mark.parametrize(
    ("params", "device", "kind", "words"),
    [
        ({"apiVersion": API, "kind": "MigDeviceConfig"}, "gpu-0", "gpu",
         "config[0] (FromClaim) MigDeviceConfig: names no request and fits none of the "
         "claim's devices ('gpu-0' of type gpu): a MigDeviceConfig applies to mig devices "
         "only; it would be replaced by the default"),
        (gpu(strategy="TimeSlicing"), MIG_NAME, "mig",
         f"config[0] (FromClaim) GpuConfig: names no request and fits none of the claim's "
         f"devices ('{MIG_NAME}' of type mig): a GpuConfig applies to gpu devices only"),
        ({"apiVersion": API, "kind": "VfioDeviceConfig"}, "gpu-0", "gpu",
         "config[0] (FromClaim) VfioDeviceConfig: names no request and fits none"),
    ],
    ids=["mig-config-on-a-gpu", "gpu-config-on-a-mig-device", "vfio-config-on-a-gpu"],
)  # fmt: skip
def test_a_config_of_a_kind_none_of_the_claims_devices_takes_is_an_error(
    params: dict[str, Any], device: str, kind: configs.DeviceKind, words: str
) -> None:
    """The reference skips it and gives the device the default config: the user's
    sharing settings silently vanish. gpudra says so (docs/differences.md)."""
    gates = fg.parse("TimeSlicingSettings=true,PassthroughSupport=true")
    with pytest.raises(ConfigError) as err:
        configs.resolve([opaque(params)], [result("a", device)], {device: kind}, gates)
    assert words in str(err.value)


def test_a_config_for_an_alternative_not_chosen_is_not_an_error() -> None:
    """With firstAvailable the user cannot know which alternative is allocated: configs
    for each kind are expected, and the one for the kind not chosen applies to none."""
    mig_config = {"apiVersion": API, "kind": "MigDeviceConfig"}
    groups = configs.resolve(
        [opaque(ts("Long")), opaque(mig_config)],
        [result("gpu/full", "gpu-0")],
        {"gpu-0": "gpu"},
        ALL_SHARING,
    )
    assert [(g.origin, interval_of(g)) for g in groups] == [("config[0] (FromClaim)", "Long")]


def test_other_drivers_configs_are_skipped_unread() -> None:
    foreign = opaque({"anything": "goes"})
    assert foreign.opaque is not None
    foreign.opaque.driver = "nic.example.com"
    assert configs.collect([foreign]) == []


def test_a_vfio_device_without_the_passthrough_gate_has_no_config() -> None:
    with pytest.raises(ConfigError, match="no config applies"):
        configs.resolve(None, [result("v", "gpu-vfio-0")], {"gpu-vfio-0": "vfio"}, fg.parse(""))


def test_wire_names_match_the_reference_api() -> None:
    vfio = configs.decode(
        {"apiVersion": API, "kind": "VfioDeviceConfig",
         "iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": True}},
        ORIGIN,
    )  # fmt: skip
    assert vfio == configs.VfioDeviceConfig(
        iommu=configs.IommuConfig(backend_policy="PreferIommuFD", enable_api_device=True)
    )
    mps = configs.decode(
        gpu(strategy="MPS", mpsConfig={"multiUser": True, "defaultPinnedDeviceMemoryLimit": "1Gi"}),
        ORIGIN,
    )
    assert isinstance(mps, configs.GpuConfig) and mps.sharing and mps.sharing.mps_config
    assert mps.sharing.mps_config.multi_user is True
