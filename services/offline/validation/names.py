"""The names the API server checks: drivers, pools, label keys and values, DNS labels and
subdomains, and the qualified names of attributes and capacities."""

from __future__ import annotations

import re

from services.core.kube import names
from services.offline.validation.fields import invalid, required, too_long
from services.offline.validation.rules import LATEST, Rules

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex "
    "used for validation is '[A-Za-z_][A-Za-z0-9_]*')"
)


def driver_name(name: str, path: str) -> list[str]:
    """ValidateCSIDriverName (the rules for a driver's name)."""
    if not name:
        return [required(path)]
    errors = [too_long(path, 63)] if len(name.encode()) > 63 else []
    return errors + [invalid(path, name, p) for p in names.dns1123_subdomain(name.lower())]


def pool_name(name: str, path: str) -> list[str]:
    if not name:
        return [required(path)]
    errors = [too_long(path, 253)] if len(name.encode()) > 253 else []
    for part in name.split("/"):
        errors += dns_subdomain(part, path)
    return errors


def label_key(key: str, path: str) -> list[str]:
    """metav1validation.ValidateLabelName."""
    return [invalid(path, key, problem) for problem in names.label_key(key)]


def label_value(value: str, path: str) -> list[str]:
    return [invalid(path, value, problem) for problem in names.label_value(value)]


def dns_label(name: str, path: str) -> list[str]:
    return [invalid(path, name, problem) for problem in names.dns1123_label(name)]


def dns_subdomain(name: str, path: str) -> list[str]:
    return [invalid(path, name, problem) for problem in names.dns1123_subdomain(name)]


def _c_identifier(name: str, path: str) -> list[str]:
    errors = []
    if len(name) > 32:
        errors.append(too_long(path, 32))
    if not _C_IDENTIFIER.fullmatch(name):
        errors.append(invalid(path, name, _C_IDENTIFIER_MSG))
    return errors


def qualified_name(name: str, path: str, rules: Rules) -> list[str]:
    """validateQualifiedName. 1.34 says an empty name, domain or identifier is a
    Required value (``name required``); from 1.35 they are Invalid ones."""
    old = rules.minor < 35
    if old and not name:
        return [required(path, "name required")]
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(parts[0], path)
    errors: list[str] = []
    if len(parts) >= 2:
        domain, ident = parts[0], parts[1]
        if not domain:
            detail = "the domain must not be empty"
            errors.append(required(path, detail) if old else invalid(path, "", detail))
        else:
            errors += dns_subdomain(domain, path)
        if not ident:
            detail = "the name must not be empty"
            errors.append(required(path, detail) if old else invalid(path, "", detail))
        else:
            errors += _c_identifier(ident, path)
    return errors


def fully_qualified_name(name: str, path: str, rules: Rules = LATEST) -> list[str]:
    """validateFullyQualifiedName: a domain is needed (1.34: "must include a domain",
    not said of an empty name)."""
    errors = qualified_name(name, path, rules)
    if rules.minor < 35:
        if name and "/" not in name:
            errors.append(invalid(path, name, "must include a domain"))
    elif "/" not in name:
        errors.append(
            invalid(
                path,
                name,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errors
