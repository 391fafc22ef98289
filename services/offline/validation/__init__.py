"""The validation kube-apiserver runs on create, for the objects ``gpudra allocate`` reads.

A what-if run must refuse what a cluster would refuse, in the API server's
words (pkg/apis/resource/validation of the Kubernetes minor followed, 1.34 to
1.37: field path, then ``Invalid value: <value>: <why>``, ``Required value``,
``Forbidden``, ``Too many``, ``Too long``, ``Duplicate value``, ``Unsupported
value``, ``Not found``: ``fields``), or a claim that could never be created would be
reported as allocatable. Rules follow validation.go function by function, one module
per thing validated:

* ``meta``: object metadata (ValidateObjectMeta);
* ``claims``: the claim's spec (validateDeviceClaim): request and subrequest shape
  and names (unique), device class names, selectors (``cel``: compiled in the DRA
  environment: syntax, types, literals, string.format, cost limit; kube-apiserver's
  NewExpressions environment, which in 1.34 has no lists extension), allocation mode
  and count, tolerations (``taints``), derivedAttributes (``derived``, 1.37:
  referenced by a constraint, compiled, total cost), constraints and config request
  references (``references``, unique), opaque configs (``configs``: driver name,
  parameters); and AuthorizedForAdmin;
* ``status``: the claim's status (validateAllocationResult, for the scheduler's
  write): results naming known requests, driver, pool and device names, binding
  conditions (``binding``), tolerations (1.37), shareID (validateUID),
  skipNodeOperations (1.37), configs, the node selector (``nodes``);
* ``slices``: validateResourceSliceSpec: driver and pool names, node selection
  (``nodes``: node name, ValidateNodeSelector with exactly one term, matchFields),
  devices and sharedCounters never together (1.35+), at most 128 devices or 64 with
  taints, consumed counters or (1.36+) list attributes, unique device names; per
  device (``devices``): attributes and capacities (at most 32; 1.36+ at most 48
  values), attribute values (``attributes``: one of eight, strings, semver, non-empty
  lists), capacity request policies (``capacity``), taints (at most 16), consumed
  counters (at most 2), per-device node selection, binding conditions,
  nodeAllocatableResources (``allocatable``, 1.37); counter sets (``counters``: at
  most 8, 32 counters); partitionTypeAttribute and skipNodeOperations (1.37);
* ``classes``: selectors, configs, extendedResourceName;
* ``taints``: taints and tolerations, and DeviceTaintRules.

Kubernetes 1.34 differs in these (each keyed on the minor where the rule lives):
a list past its limit has every item checked before Too many (lists.check_list; 1.35
stops at Too many), a duplicate is reported at its key's field
(``requests[1].name``, lists.duplicates), a request with both ``exactly`` and
``firstAvailable`` has both checked (claims), an empty qualified name or part
is a Required value and an unqualified one "must include a domain"
(names.qualified_name), an attribute without a value is a Required value, no taint
effect ``None`` (taints.taint_effects), at most 4 taints a device, and counters are
limited per slice (at most 32 in its counter sets, 1024 consumed by its
devices, 32 by one device, each consumed counter one of the slice's own sets:
counters.slice_counter_totals, counters.consumed_counters_1_34) where 1.35 limits
counter sets (8) and consumptions (2). Before 1.36 a bad map key is reported at the
key (``attributes[k]``, lists.key_path). What differs by release and gates is in
``rules.Rules``.

Checks that only declarative validation makes and 1.37 does not enforce
(compatibilityGroups' size, skipNodeOperations' values) are left out: the
reference allocator, which runs the registry strategies, accepts them. Each
function returns the errors of one object (empty when valid), already worded;
objects here have had disabled fields dropped first (structured/admission.py,
inputs.drop_new_*), as PrepareForCreate does before Validate.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from services.allocator.cel.env import CelEnvironment
from services.core.kube.resource import DeviceClass, ObjectMeta, ResourceClaim, ResourceSlice
from services.offline.validation.claims import authorized_for_admin, validate_claim
from services.offline.validation.classes import validate_class
from services.offline.validation.meta import validate_meta
from services.offline.validation.rules import Rules
from services.offline.validation.slices import validate_slice
from services.offline.validation.status import validate_claim_status


def validate(
    obj: msgspec.Struct,
    env: CelEnvironment,
    rules: Rules,
    namespaces: Mapping[str, dict[str, str]],
) -> list[str]:
    """What kube-apiserver says when ``obj`` is created, in the order it checks: the
    metadata first and alone, then the spec, then (a claim) admin access, then the
    status. ``namespaces``: the labels of each namespace given, by name."""
    meta = getattr(obj, "metadata", None)
    if isinstance(meta, ObjectMeta):
        errors = validate_meta(meta, isinstance(obj, ResourceClaim))
        if errors:
            return errors
    if isinstance(obj, DeviceClass):
        return validate_class(obj, env, rules)
    if isinstance(obj, ResourceSlice):
        return validate_slice(obj, rules)
    if isinstance(obj, ResourceClaim):
        errors = validate_claim(obj, env, rules)
        namespace = obj.metadata.namespace or "default"
        errors = errors or authorized_for_admin(obj, namespaces.get(namespace))
        return errors or validate_claim_status(obj, rules)
    return []
