"""The ComputeDomain model: devices, classes, names and the strict opaque configs."""

from __future__ import annotations

from typing import Any

import pytest

from services.core.kube.resource import (
    DeviceAllocationConfiguration,
    OpaqueDeviceConfiguration,
    to_builtins,
)
from services.core.model import computedomain as cd
from services.core.model.opaque import ConfigError

API = "resource.nvidia.com/v1beta1"


def entry(
    params: Any, source: str = "FromClaim", requests: list[str] | None = None,
    driver: str = cd.CD_DRIVER,
) -> DeviceAllocationConfiguration:  # fmt: skip
    return DeviceAllocationConfiguration(
        source=source,  # type: ignore[arg-type]
        requests=requests,
        opaque=OpaqueDeviceConfiguration(driver=driver, parameters=params),
    )


def channel(domain: str = "uid-1", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": cd.CHANNEL_CONFIG, "domainID": domain, **extra}


def daemon(domain: str = "uid-1") -> dict[str, Any]:
    return {"apiVersion": API, "kind": cd.DAEMON_CONFIG, "domainID": domain}


def test_every_node_publishes_channel_0_and_daemon_0() -> None:
    devices = [to_builtins(d) for d in cd.node_devices()]
    assert devices == [
        {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
        {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}},
    ]
    assert cd.device_type("channel-0") == "channel" and cd.device_type("channel-2047") == "channel"
    assert cd.device_type("daemon-0") == "daemon"
    for bad in ("channel-2048", "channel-x", "daemon-1", "gpu-0", "channel-", ""):
        with pytest.raises(ValueError, match=r"is not a compute-domain\.nvidia\.com device"):
            cd.device_type(bad)


def test_names_and_paths_are_the_references() -> None:
    assert cd.daemon_name("abc") == "computedomain-daemon-abc"
    assert cd.DOMAIN_LABEL == cd.FINALIZER == "resource.nvidia.com/computeDomain"
    assert cd.TARGET_LABEL == "resource.nvidia.com/computeDomainTarget"
    assert cd.domains_path() == "/apis/resource.nvidia.com/v1beta1/computedomains"
    assert cd.domains_path("ns", "d") == (
        "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains/d"
    )
    names = [c.metadata.name for c in cd.device_classes()]
    assert names == [
        "compute-domain-daemon.nvidia.com",
        "compute-domain-default-channel.nvidia.com",
    ]


def test_the_claims_own_config_wins_over_the_class() -> None:
    configs = [entry(channel("from-claim")), entry(channel("from-class"), source="FromClass")]
    config, origin = cd.config_for(configs, "channel", "channel")
    assert config.domain_id == "from-claim" and origin == "config[0] (FromClaim)"
    assert isinstance(config, cd.ComputeDomainChannelConfig) and config.mode == "Single"


def test_a_config_scoped_to_another_request_does_not_apply() -> None:
    configs = [entry(channel("a", allocationMode="All"), requests=["channel"]),
               entry(channel("b"), requests=["other"])]  # fmt: skip
    config, _ = cd.config_for(configs, "channel", "channel")
    assert config.domain_id == "a"
    assert isinstance(config, cd.ComputeDomainChannelConfig) and config.mode == "All"


def test_no_config_is_the_default_whose_domain_id_is_empty() -> None:
    with pytest.raises(ConfigError, match=r"default config ComputeDomainChannelConfig\.domainID: "
                       "must not be empty"):  # fmt: skip
        cd.config_for([], "channel", "channel")
    gpu_only = [entry({"apiVersion": API, "kind": "GpuConfig"}, driver="gpu.nvidia.com")]
    with pytest.raises(ConfigError, match=r"ComputeDomainDaemonConfig\.domainID"):
        cd.config_for(gpu_only, "daemon", "daemon")


def test_a_config_of_the_other_kind_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"config\[0\] \(FromClaim\): cannot apply ComputeDomainChannelConfig to request: d",
    ):
        cd.config_for([entry(channel())], "d", "daemon")
    with pytest.raises(ConfigError, match="cannot apply ComputeDomainDaemonConfig to request: c"):
        cd.config_for([entry(daemon(), requests=["c"])], "c", "channel")


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (channel(extra=1), r"ComputeDomainChannelConfig\.extra: unknown field"),
        (channel(allocationMode="Some"), "unknown allocation mode 'Some'; valid: Single, All"),
        (channel(domainID=7), r"ComputeDomainChannelConfig\.domainID: expected `str`, got `int`"),
        ({**channel(), "apiVersion": "v1"}, "unsupported apiVersion 'v1'"),
        ({**channel(), "kind": "GpuConfig"}, "unknown kind 'GpuConfig'"),
        (["not", "an", "object"], "parameters must be an object, got list"),
        (channel(""), r"\.domainID: must not be empty"),
    ],
)
def test_hostile_configs_are_refused_by_field(params: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        cd.config_for([entry(params)], "channel", "channel")


@pytest.mark.parametrize("mode", ["", None])
def test_an_empty_allocation_mode_is_unset_as_go_reads_it(mode: str | None) -> None:
    """An empty or null allocationMode is Go's zero value, the same as none: Single."""
    config, _ = cd.config_for([entry(channel(allocationMode=mode))], "channel", "channel")
    assert isinstance(config, cd.ComputeDomainChannelConfig) and config.mode == "Single"


@pytest.mark.parametrize("mode", ["all", "single", "Multiple"])
def test_an_allocation_mode_other_than_single_or_all_is_refused(mode: str) -> None:
    """The reference injects one channel for anything but "All" (a misspelt "all" gets
    one, not 2048); gpudra refuses it (docs/differences.md)."""
    with pytest.raises(ConfigError, match=f"unknown allocation mode '{mode}'; valid: Single, All"):
        cd.config_for([entry(channel(allocationMode=mode))], "channel", "channel")


def test_a_bad_config_is_refused_even_when_it_does_not_win() -> None:
    configs = [entry(channel(bogus=True), requests=["other"]), entry(channel())]
    with pytest.raises(ConfigError, match=r"config\[0\] .*\.bogus: unknown field"):
        cd.config_for(configs, "channel", "channel")
