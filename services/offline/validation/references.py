"""References to a claim's requests (``gpu`` or ``gpu/small``), from its constraints,
its configs and its allocation results."""

from __future__ import annotations

from services.core.kube.resource import ResourceClaim
from services.offline.validation.fields import invalid
from services.offline.validation.lists import check_set
from services.offline.validation.names import dns_label
from services.offline.validation.rules import Rules

MAX_REQUESTS = 32
_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and a "
    "subrequest separated by '/'"
)

#: A claim's request names, each with its subrequests' names (None: it has none).
RequestNames = dict[str, set[str] | None]


def request_names(claim: ResourceClaim) -> RequestNames:
    """What a reference may name in ``claim``."""
    names: RequestNames = {}
    for request in (claim.spec.devices.requests if claim.spec.devices else None) or []:
        subs = request.first_available or []
        names[request.name] = {s.name for s in subs} if subs else None
    return names


def reference(name: str, path: str, names: RequestNames) -> list[str]:
    """``request`` or ``request/subrequest``, each part a DNS label naming one of the claim's."""
    segments = name.split("/")
    if len(segments) > 2:
        return [invalid(path, name, _REF_MSG)]
    errors = [e for segment in segments for e in dns_label(segment, path)]
    known = segments[0] in names
    if known and len(segments) == 2:
        subs = names[segments[0]]
        known = subs is not None and segments[1] in subs
    if not known:
        errors.append(invalid(path, name, _REF_MSG))
    return errors


def references(refs: list[str] | None, path: str, names: RequestNames, rules: Rules) -> list[str]:
    """A list of references: each one known, none twice, at most 32."""

    def check(j: int, name: str) -> list[str]:
        return reference(name, f"{path}[{j}]", names)

    return check_set(refs or [], MAX_REQUESTS, path, rules, check, str)
