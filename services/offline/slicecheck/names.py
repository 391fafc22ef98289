"""The names in a slice: DNS labels and subdomains, driver and pool names, qualified
attribute and capacity names, label keys and values."""

from __future__ import annotations

import re

from services.offline.slicecheck.problem import Problem

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def dns_label(value: str, path: str) -> list[Problem]:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        return [Problem(path, f"must be a DNS label (<=63 of [a-z0-9-]), got {value!r}")]
    return []


def dns_subdomain(value: str, path: str, max_len: int = 253) -> list[Problem]:
    if len(value) > max_len or not _DNS_SUBDOMAIN.match(value):
        return [Problem(path, f"must be a DNS subdomain (<={max_len} chars), got {value!r}")]
    return []


def driver_name(value: str, path: str) -> list[Problem]:
    if not value:
        return [Problem(path, "required")]
    return dns_subdomain(value.lower(), path, max_len=63)


def pool_name(value: str, path: str) -> list[Problem]:
    if not value:
        return [Problem(path, "required")]
    if len(value) > 253:
        return [Problem(path, f"must be at most 253 characters, got {len(value)}")]
    return [p for part in value.split("/") for p in dns_subdomain(part, path)]


def qualified_name(name: str, path: str) -> list[Problem]:
    """``<C identifier <=32>`` or ``<driver-style domain>/<C identifier <=32>``."""
    parts = name.split("/")
    if len(parts) > 2:
        return [Problem(path, f"at most one '/' allowed in a qualified name, got {name!r}")]
    problems = driver_name(parts[0], path) if len(parts) == 2 else []
    ident = parts[-1]
    if len(ident) > 32 or not _C_IDENTIFIER.match(ident):
        problems.append(
            Problem(path, f"name must be a C identifier of at most 32 characters, got {ident!r}")
        )
    return problems


def label_key(key: str, path: str) -> list[Problem]:
    prefix, _, name = key.rpartition("/")
    problems = dns_subdomain(prefix, path) if prefix else []
    if len(name) > 63 or not _LABEL_NAME.match(name):
        problems.append(Problem(path, f"must be a label name (<=63 chars), got {key!r}"))
    return problems


def label_value(value: str, path: str) -> list[Problem]:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return [Problem(path, f"must be a label value, got {value!r}")]
    return []
