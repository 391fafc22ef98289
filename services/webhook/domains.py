"""A compute-domain claim is admitted only for a ComputeDomain of its own.

Every node publishes one ``channel-0`` and one ``daemon-0`` (compute-domain.nvidia.com).
A claim that holds them for a domain that does not exist, or is another namespace's,
keeps the real domain's pods off that node until it is deleted: prepare refuses it,
but only after the scheduler gave it the device. So each request (or subrequest) for
the channel or the daemon DeviceClass must be covered by a config of its kind (the one
prepare takes, :func:`services.core.model.computedomain.config_for`) whose ``domainID``
names a ComputeDomain that exists:

- a channel's in the claim's own namespace (what prepare checks,
  services/preparer/computedomain/gate.py);
- a daemon's in any namespace, and daemon devices are claimed only in the driver's
  namespace, where the ComputeDomain controller makes the daemon templates
  (services/domains/objects.py), and only it may make such a template.

A domain is found by UID (a config names no name) in a list through the API, with the
webhook's own account (``list computedomains``). The rules that need no lookup are
also the chart's ValidatingAdmissionPolicy ``<release>-compute-domain-claims``, which
holds without the webhook.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from services.core.kube.client import KubeApi
from services.core.kube.resource import DeviceAllocationConfiguration, OpaqueDeviceConfiguration
from services.core.model import computedomain as cd
from services.core.model.opaque import ConfigError
from services.webhook.admit import Verdict
from services.webhook.review import AdmissionRequest

CLASSES: Mapping[str, cd.DeviceType] = {cd.CHANNEL_CLASS: cd.CHANNEL_TYPE,
                                        cd.DAEMON_CLASS: cd.DAEMON_TYPE}  # fmt: skip
CONFIG_OF: Mapping[cd.DeviceType, str] = {cd.CHANNEL_TYPE: cd.CHANNEL_CONFIG,
                                          cd.DAEMON_TYPE: cd.DAEMON_CONFIG}  # fmt: skip
TEMPLATE = "ResourceClaimTemplate"


@dataclass(frozen=True)
class Wanted:
    """A request of ours and the config prepare would take for it."""

    request: str
    kind: cd.DeviceType
    config: cd.ComputeDomainConfig
    origin: str


def _spec(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    spec = obj.get("spec") or {}
    if kind == TEMPLATE:
        spec = spec.get("spec") or {}
    if not isinstance(spec, dict):
        raise ValueError("spec: expected an object")
    return spec


def domain_requests(spec: Mapping[str, Any]) -> Iterator[tuple[str, cd.DeviceType]]:
    """(request name, device type) of every request and subrequest (``req/sub``) for the
    channel or daemon DeviceClass; v1 and v1beta2 (``exactly``) and v1beta1 alike."""
    for request in (spec.get("devices") or {}).get("requests") or []:
        name = str(request.get("name", ""))
        exactly = request.get("exactly") or {}
        device_class = exactly.get("deviceClassName") or request.get("deviceClassName")
        if device_class in CLASSES:
            yield name, CLASSES[device_class]
        for sub in request.get("firstAvailable") or []:
            if sub.get("deviceClassName") in CLASSES:
                yield f"{name}/{sub.get('name', '')}", CLASSES[sub["deviceClassName"]]


def _configs(spec: Mapping[str, Any]) -> list[DeviceAllocationConfiguration]:
    """The claim's configs as the allocation carries them (FromClaim, in order)."""
    found = []
    for entry in (spec.get("devices") or {}).get("config") or []:
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict):
            continue
        found.append(DeviceAllocationConfiguration(
            source="FromClaim", requests=list(entry.get("requests") or []) or None,
            opaque=OpaqueDeviceConfiguration(driver=str(opaque.get("driver", "")),
                                             parameters=opaque.get("parameters")),
        ))  # fmt: skip
    return found


@dataclass
class DomainCheck:
    """``namespace``: the driver's; ``controller``: the ComputeDomain controller's user
    (``system:serviceaccount:<namespace>:<account>``)."""

    api: KubeApi
    namespace: str
    controller: str

    async def judge(self, request: AdmissionRequest) -> Verdict:
        if request.operation not in ("CREATE", "UPDATE") or request.object is None:
            return Verdict(True)
        kind = request.kind.kind
        meta = request.object.get("metadata") or {}
        namespace = request.namespace or str(meta.get("namespace", ""))
        what = f"{kind} {namespace}/{request.name or meta.get('name', '<generated>')}"
        try:
            spec = _spec(request.object, kind)
            if request.operation == "UPDATE" and request.old_object is not None:
                if spec == _spec(request.old_object, kind):
                    return Verdict(True)  # claims' and templates' specs are immutable
            ours = list(domain_requests(spec))
            configs = _configs(spec)
        except (AttributeError, TypeError, ValueError) as exc:
            return Verdict(False, f"{what}: cannot read its device requests: {exc}", 400)
        if not ours:
            return Verdict(True)
        wanted, errors = [], []
        for name, device in ours:
            try:
                config, origin = cd.config_for(configs, name, device)
            except ConfigError as exc:
                errors.append(f"request {name} needs a {CONFIG_OF[device]} naming its "
                              f"ComputeDomain: {exc}")  # fmt: skip
                continue
            wanted.append(Wanted(name, device, config, origin))
        if errors:
            return Verdict(False, f"{what}: {'; '.join(errors)}", 422)
        if any(w.kind == cd.DAEMON_TYPE for w in wanted):
            if namespace != self.namespace:
                return Verdict(False, (
                    f"{what}: daemon devices ({cd.DAEMON_CLASS}) are claimed only in the "
                    f"driver's namespace {self.namespace}, from the ComputeDomain "
                    "controller's daemon templates"), 403)  # fmt: skip
            if kind == TEMPLATE and request.user_info.username != self.controller:
                return Verdict(False, (
                    f"{what}: only the ComputeDomain controller ({self.controller}) makes "
                    f"daemon claim templates, not {request.user_info.username or 'anonymous'}"
                ), 403)  # fmt: skip
        domains = await self._domains()
        for want in wanted:
            uid = want.config.domain_id
            field = f"{want.origin} {want.config.kind}.domainID"
            where = domains.get(uid)
            if want.kind == cd.CHANNEL_TYPE and where not in (None, namespace):
                errors.append(f"{field}: ComputeDomain {uid} is in namespace {where}, "
                              f"not {namespace} (request {want.request})")  # fmt: skip
            elif where is None:
                scope = f" in namespace {namespace}" if want.kind == cd.CHANNEL_TYPE else ""
                errors.append(f"{field}: no ComputeDomain with UID {uid}{scope} "
                              f"(request {want.request})")  # fmt: skip
        if errors:
            return Verdict(False, f"{what}: {'; '.join(errors)}", 422)
        return Verdict(True)

    async def _domains(self) -> dict[str, str]:
        """Every ComputeDomain's UID -> its namespace."""
        listing = await self.api.list(cd.domains_path(), {})
        found = {}
        for raw in listing.items:
            meta = json.loads(bytes(raw)).get("metadata") or {}
            found[str(meta.get("uid", ""))] = str(meta.get("namespace", ""))
        return found
