"""ValidateObjectMeta's rules for a created object, which run before its spec's."""

from __future__ import annotations

from services.core.kube import names
from services.core.kube.resource import ObjectMeta
from services.offline.validation.fields import invalid, required
from services.offline.validation.names import dns_label, dns_subdomain


def validate_meta(meta: ObjectMeta, namespaced: bool) -> list[str]:
    """A name (or generateName) that is a DNS subdomain (for claims, slices and classes
    alike), the namespace a DNS label, label keys and values, annotation keys."""
    errors: list[str] = []
    if not meta.name and not meta.generate_name:
        errors.append(required("metadata.name", "name or generateName is required"))
    elif meta.name:
        errors += dns_subdomain(meta.name, "metadata.name")
    if namespaced and meta.namespace:
        errors += dns_label(meta.namespace, "metadata.namespace")
    for key, value in (meta.labels or {}).items():
        errors += [invalid("metadata.labels", key, p) for p in names.label_key(key)]
        errors += [invalid("metadata.labels", value, p) for p in names.label_value(value)]
    for key in meta.annotations or {}:
        errors += [invalid("metadata.annotations", key, p) for p in names.label_key(key.lower())]
    return errors
