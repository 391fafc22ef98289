"""What every opaque config of ours shares: the API version, strict decoding, errors.

Both NVIDIA drivers (``gpu.nvidia.com`` in services/core/model/configs.py and
``compute-domain.nvidia.com`` in services/core/model/computedomain.py) decode their
``resource.nvidia.com/v1beta1`` parameters strictly, and name the field in every
error, e.g. ``config[0] (FromClaim) ComputeDomainChannelConfig.domainID: ...``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from services.core.model.refusal import ClaimRefused

API_VERSION = "resource.nvidia.com/v1beta1"


class ConfigError(ClaimRefused, ValueError):
    """A config that cannot be used; the message names the config and the field."""


class Strict(msgspec.Struct, forbid_unknown_fields=True, rename="camel", omit_defaults=True):
    """An opaque config: unknown fields are errors, never silently ignored."""


T = TypeVar("T", bound=Strict)


def decode_strict(params: Any, origin: str, kinds: Mapping[str, type[T]], known: str = "") -> T:
    """One opaque ``parameters`` object as the kind it names: object, API version, kind,
    then every field strictly. ``known`` adds to the list of kinds in the error."""
    if not isinstance(params, dict):
        raise ConfigError(f"{origin}: parameters must be an object, got {type(params).__name__}")
    api_version, kind = params.get("apiVersion"), params.get("kind")
    if api_version != API_VERSION:
        raise ConfigError(
            f"{origin}: unsupported apiVersion {api_version!r}; expected {API_VERSION}"
        )
    if not isinstance(kind, str) or kind not in kinds:
        where = f"{API_VERSION}, {known}" if known else API_VERSION
        raise ConfigError(
            f"{origin}: unknown kind {kind!r}; expected one of {', '.join(kinds)} ({where})"
        )
    try:
        return msgspec.convert(params, type=kinds[kind])
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{origin} {kind}{describe(str(exc))}") from exc


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")


def describe(error: str) -> str:
    """Turn msgspec's ``msg - at `$.a.b``` into ``.a.b: msg`` (unknown fields get their name)."""
    match = _AT.match(error)
    msg, path = (match["msg"], match["path"] or "") if match else (error, "")
    unknown = _UNKNOWN.match(msg)
    if unknown:
        return f"{path}.{unknown['name']}: unknown field"
    return f"{path}: {msg[0].lower()}{msg[1:]}" if msg else path
