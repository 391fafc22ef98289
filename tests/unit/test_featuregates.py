from __future__ import annotations

import pytest

from services.core import featuregates as fg


def test_defaults_match_reference() -> None:
    gates = fg.parse("")
    assert not any(gates.enabled(name) for name in fg.DEFAULTS)


def test_parse_and_spec_round_trip() -> None:
    gates = fg.parse("DynamicMIG=true, NVMLDeviceHealthCheck=TRUE")
    assert gates.enabled(fg.DYNAMIC_MIG) and gates.enabled(fg.NVML_DEVICE_HEALTH_CHECK)
    assert fg.parse(gates.spec()) == gates


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("Nope=true", "unknown feature gate 'Nope'; valid: DeviceMetadata, DynamicMIG"),
        ("DynamicMIG=yes", "expected DynamicMIG=true|false"),
        ("DynamicMIG", "expected DynamicMIG=true|false"),
        ("DynamicMIG=true,MPSSupport=true", "cannot both be enabled"),
        ("DynamicMIG=true,PassthroughSupport=true", "cannot both be enabled"),
    ],
)
def test_bad_gates_say_what_is_wrong(spec: str, needle: str) -> None:
    with pytest.raises(fg.FeatureGateError, match=needle.replace("|", r"\|")):
        fg.parse(spec)
