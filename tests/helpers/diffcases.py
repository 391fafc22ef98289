"""Hand-written differential cases: one per class of input on which ``gpudra allocate``
and ``reference-allocator`` once disagreed (API-server validation, CEL compile and
run-time rules, the Kubernetes CEL libraries, inputs gpudra could not read, outcome
rules), and one per behaviour a release changed or added (:data:`RELEASES`).
tests/e2e/allocator/test_differential_cases.py runs both tools on each, for every release
the case names (1.37 and 1.35 by default), and asserts they agree, and that the
outcome is the one the case is about for that release (so a case cannot agree by
both tools failing on something else).

Each case adds its objects to :func:`base`: one node ``n1`` with two GPUs in pool
``n1`` of driver ``gpu.example.com``, a DeviceClass ``gpu`` for them and a
DeviceClass ``any`` for every device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DRIVER = "gpu.example.com"
V1 = "resource.k8s.io/v1"
MINORS = (37, 35)  # the releases whose reference-allocator the cases run against


@dataclass(frozen=True)
class Case:
    name: str
    objects: list[dict[str, Any]]
    rc: int = 0  # 2: both refuse the input
    says: str = ""  # rc 2: a fragment of the API server's message both must print
    statuses: dict[str, str] = field(default_factory=dict)  # claim -> status (rc 0)
    gates: str = ""
    minors: tuple[int, ...] = MINORS  # the releases the case is about
    by_minor: dict[int, dict[str, str]] = field(default_factory=dict)  # statuses per release
    gates_by_minor: dict[int, str] = field(default_factory=dict)
    base: bool = True  # add base(): node n1 with two GPUs and the classes
    compare_allocations: bool = False  # the whole allocation alike, not only the devices
    devices: dict[str, list[str]] | None = None  # claim -> driver/pool/device, every release
    devices_by_minor: dict[int, dict[str, list[str]]] = field(default_factory=dict)

    def statuses_for(self, minor: int) -> dict[str, str]:
        return self.by_minor.get(minor, self.statuses)

    def gates_for(self, minor: int) -> str:
        return self.gates_by_minor.get(minor, self.gates)

    def devices_for(self, minor: int) -> dict[str, list[str]] | None:
        return self.devices_by_minor.get(minor, self.devices)


ANY_CLASS = {"apiVersion": V1, "kind": "DeviceClass", "metadata": {"name": "any"}, "spec": {}}


def _device(index: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": index},
            "productName": {"string": "Example GPU 80GB"},
            "driverVersion": {"version": "570.124.6"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def base() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        ANY_CLASS,
        {
            "apiVersion": V1,
            "kind": "ResourceSlice",
            "metadata": {"name": "n1-gpus"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [_device(0), _device(1)],
            },
        },
    ]


def claim(
    request: dict[str, Any], extra: dict[str, Any] | None = None, namespace: str = "default"
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [request], **(extra or {})}
    return {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": namespace},
        "spec": {"devices": devices},
    }


def exactly(selector: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu", **fields}
    if selector is not None:
        body["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": "r", "exactly": body}


def cel(name: str, expression: str, status: str) -> Case:
    """A selector that compiles in both and gives ``status`` on the base devices."""
    return Case(name, [claim(exactly(expression))], statuses={"c": status})


def refused(name: str, expression: str, says: str) -> Case:
    """A selector the API server refuses."""
    return Case(name, [claim(exactly(expression))], rc=2, says=says)


def slice_with(device: dict[str, Any], node: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "other.example.com",
        "pool": {"name": "extra", "generation": 1, "resourceSliceCount": 1},
        "devices": [device],
    }
    spec.update(node if node is not None else {"nodeName": "n2"})
    return {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": "extra"}, "spec": spec}


def _named_node(node: str) -> dict[str, Any]:
    """A slice of another driver that makes ``node`` known by name only."""
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-named"},
        "spec": {
            "driver": "named.example.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "other"}],
        },
    }


def _policy(policy: dict[str, Any], multi: bool = True) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": "shared",
        "capacity": {"memory": {"value": "10Gi", "requestPolicy": policy}},
    }
    if multi:
        device["allowMultipleAllocations"] = True
    return slice_with(device)


CC = "DRAConsumableCapacity=true"
MEMORY = f"device.capacity['{DRIVER}'].memory"
VERSION = f"device.attributes['{DRIVER}'].driverVersion"
PRODUCT = f"device.attributes['{DRIVER}'].productName"
OTHER_MEMORY = (
    "device.driver == 'other.example.com' && "
    "device.capacity['other.example.com'].memory.compareTo(quantity('80')) == 0"
)


VALIDATION = [
    refused("cel-syntax", "device.driver ==", "Syntax error: mismatched input '<EOF>'"),
    refused(
        "cel-not-bool", "device.driver", "must evaluate to bool or the unknown type, not string"
    ),
    refused("cel-undeclared", "foo == 1", "undeclared reference to 'foo'"),
    refused(
        "cel-no-overload",
        f"{MEMORY} == 'x'",
        "found no matching overload for '_==_' applied to '(kubernetes.Quantity, string)'",
    ),
    refused(
        "cel-mixed-list", "device.driver in ['a', 1]", "expected type 'string' but found 'int'"
    ),
    refused(
        "cel-cost",
        f"{PRODUCT}.split(' ').all(a, {PRODUCT}.split(' ').all(b, "
        f"{PRODUCT}.split(' ').all(c, a + b + c != '')))",
        "Forbidden: too complex, exceeds cost limit",
    ),
    refused("cel-const-int", "int('abc') == 1", "program instantiation failed: type conversion"),
    refused("cel-const-uint", "uint(-1) == 1u", "unsigned integer overflow"),
    refused("cel-duration", "duration('x') > duration('1s')", "invalid duration argument"),
    refused(
        "cel-timestamp", "timestamp('bad') < timestamp('2020-01-01T00:00:00Z')", "invalid timestamp"
    ),
    refused("cel-regex", "device.driver.matches('[')", "invalid matches argument"),
    refused("cel-find", "device.driver.find('[') == ''", "error parsing regexp"),
    refused(
        "cel-format-decimal",
        "'%d'.format(['a']) == 'x'",
        "1:14: error during formatting: decimal clause can only be used on integers",
    ),
    refused("cel-format-fixed", "'%.2f'.format([1]) != ''", "fixed-point clause can only be used"),
    Case(
        "count-negative",
        [claim(exactly(count=-1))],
        rc=2,
        says="count: Invalid value: -1: must be greater than zero",
    ),
    Case(
        "count-with-all",
        [claim(exactly(allocationMode="All", count=2))],
        rc=2,
        says="must not be specified when allocationMode is 'All'",
    ),
    Case(
        "mode-unknown",
        [claim(exactly(allocationMode="Some"))],
        rc=2,
        says='Unsupported value: "Some"',
    ),
    Case(
        "nine-subrequests",
        [
            claim(
                {
                    "name": "r",
                    "firstAvailable": [
                        {"name": f"s{i}", "deviceClassName": "gpu"} for i in range(9)
                    ],
                }
            )
        ],
        rc=2,
        says="firstAvailable: Too many: 9: must have at most 8 items",
    ),
    Case(
        "exactly-and-first-available",
        [claim({**exactly(), "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]})],
        rc=2,
        says="exactly one of `exactly` or `firstAvailable` is required, but multiple fields",
    ),
    Case(
        "request-name",
        [claim({"name": "R_1", "exactly": {"deviceClassName": "gpu"}})],
        rc=2,
        says="RFC 1123 label",
    ),
    Case(
        "constraint-unknown-request",
        [
            claim(
                exactly(),
                {"constraints": [{"requests": ["zz"], "matchAttribute": f"{DRIVER}/index"}]},
            )
        ],
        rc=2,
        says='constraints[0].requests[0]: Invalid value: "zz": must be the name of a request',
    ),
    Case(
        "constraint-unqualified",
        [claim(exactly(), {"constraints": [{"matchAttribute": "index"}]})],
        rc=2,
        says="a fully qualified name must be a domain and a name separated by a slash",
    ),
    Case(
        "config-unknown-request",
        [
            claim(
                exactly(),
                {"config": [{"requests": ["zz"], "opaque": {"driver": DRIVER, "parameters": {}}}]},
            )
        ],
        rc=2,
        says='config[0].requests[0]: Invalid value: "zz"',
    ),
    Case(
        "attribute-two-values",
        [slice_with({"name": "d", "attributes": {"a": {"int": 1, "string": "x"}}})],
        rc=2,
        says="exactly one value must be specified",
    ),
    Case(
        "attribute-bad-semver",
        [slice_with({"name": "d", "attributes": {"v": {"version": "1.2"}}})],
        rc=2,
        says="must be a string compatible with semver.org spec 2.0.0",
    ),
    Case(
        "policy-valid-values-without-default",
        [_policy({"validValues": ["1Gi"]})],
        rc=2,
        says="requestPolicy.default: Required value: required when validValues is defined",
        gates=CC,
    ),
    Case(
        "policy-default-off-step",
        [_policy({"default": "3Gi", "validRange": {"min": "2Gi", "step": "2Gi"}})],
        rc=2,
        says="value is not a multiple of a given step (2Gi) from (2Gi)",
        gates=CC,
    ),
    Case(
        "policy-not-multi-allocatable",
        [_policy({"default": "1Gi", "validRange": {"min": "1Gi"}}, multi=False)],
        rc=2,
        says="requestPolicy: Forbidden: allowMultipleAllocations must be true",
        gates=CC,
    ),
    Case("unknown-field", [{**claim(exactly()), "bogus": 1}], rc=2, says='unknown field "bogus"'),
    Case(
        "unknown-nested-field",
        [claim({"name": "r", "exactly": {"deviceClassName": "gpu", "bogus": 1}})],
        rc=2,
        says='unknown field "spec.devices.requests[0].exactly.bogus"',
    ),
    Case(
        "class-selector",
        [
            {
                "apiVersion": V1,
                "kind": "DeviceClass",
                "metadata": {"name": "bad"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]},
            }
        ],
        rc=2,
        says="spec.selectors[0].cel.expression: Invalid value",
    ),
    Case(
        "admin-namespace-unlabelled",
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}},
            claim(exactly(adminAccess=True), namespace="team"),
        ],
        rc=2,
        says="admin access to devices requires the `resource.kubernetes.io/admin-access: true`",
    ),
]


OUTCOMES = [
    Case(
        "class-missing",
        [claim({"name": "r", "exactly": {"deviceClassName": "nope"}})],
        statuses={"c": "unschedulable"},
    ),
    Case(
        "subrequest-class-missing",
        [
            claim(
                {
                    "name": "r",
                    "firstAvailable": [
                        {"name": "a", "deviceClassName": "nope"},
                        {"name": "b", "deviceClassName": "gpu"},
                    ],
                }
            )
        ],
        statuses={"c": "unschedulable"},
    ),
    Case(
        "admin-namespace-labelled",
        [
            claim(exactly(adminAccess=True), namespace="team"),
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": "team",
                    "labels": {"resource.kubernetes.io/admin-access": "true"},
                },
            },
        ],
        statuses={"c": "allocated"},
    ),
    Case(
        "quantity-as-number",
        [
            slice_with({"name": "d", "capacity": {"memory": {"value": 80}}}),
            claim(exactly(OTHER_MEMORY, deviceClassName="any")),
        ],
        statuses={"c": "allocated"},
    ),
    Case(
        "hostname-of-name-only-node",
        [
            slice_with(
                {"name": "d"},
                {
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["n2"],
                                    }
                                ]
                            }
                        ]
                    }
                },
            ),
            _named_node("n2"),
            claim(exactly("device.driver == 'other.example.com'", deviceClassName="any")),
        ],
        statuses={"c": "allocated"},
    ),
    cel("semver-equals-string", f"{VERSION} == '570.124.6'", "error"),
    cel("semver-not-equals-string", f"{VERSION} != '570.124.6'", "allocated"),
    cel("string-equals-semver", f"'570.124.6' == {VERSION}", "unschedulable"),
    cel("semver-compare", f"{VERSION}.isGreaterThan(semver('500.0.0'))", "allocated"),
    cel("semver-equals-computed-string", f"{VERSION} == {PRODUCT}", "error"),
    cel("semver-equals-computed-semver", f"{VERSION} == semver('570.124.' + '6')", "allocated"),
    cel(
        "quantity-equals-computed-int", f"{MEMORY} == device.attributes['{DRIVER}'].index", "error"
    ),
    cel("int-equals-quantity", f"device.attributes['{DRIVER}'].index == {MEMORY}", "unschedulable"),
    cel("ip-equals-computed-int", "ip('1.2.3.4') == dyn(ip('1.2.3.4').family())", "error"),
    cel("semver-equals-computed-null", f"{VERSION} == dyn(null)", "unschedulable"),
    cel("semver-equals-optional", f"{VERSION} == optional.none()", "error"),
    cel("semver-equals-failing-right-side", f"{VERSION} == [1].map(x, x / 0)", "error"),
    cel("quantity-beyond-int64", "quantity('100000000000000000000').asInteger() > 0", "error"),
    cel(
        "quantity-beyond-int64-is-integer",
        "!quantity('100000000000000000000').isInteger()",
        "allocated",
    ),
    cel("quantity-compare", f"{MEMORY}.compareTo(quantity('1Gi')) > 0", "allocated"),
    cel("int-of-attribute", f"int({PRODUCT}) == 1", "error"),
    cel("division-by-zero", "1 / 0 == 1", "error"),
    cel("integer-overflow", "9223372036854775807 + 1 > 0", "error"),
    cel("unknown-attribute", f"device.attributes['{DRIVER}'].nothere == 'x'", "error"),
    cel(
        "unknown-domain-is-empty",
        "device.attributes['nothere.example.com'].size() == 0",
        "allocated",
    ),
    cel("int-equals-string", f"device.attributes['{DRIVER}'].index == 'x'", "unschedulable"),
    cel("bad-quantity-at-run-time", "quantity('bad').isInteger()", "error"),
    cel("bad-semver-at-run-time", "semver('x').major() == 1", "error"),
    cel("sets", "sets.contains([1, 2], [1])", "allocated"),
    cel("strings-format", "'%s'.format(['a']) == 'a'", "allocated"),
    cel("strings-format-scientific-at-run-time", "'%e'.format(['a']) != ''", "error"),
    cel("strings-ext", "'abc'.charAt(1) == 'b'", "allocated"),
    cel("regex-find", f"{PRODUCT}.find('[0-9]+GB') == '80GB'", "allocated"),
    cel("optional", "optional.of(1).hasValue()", "allocated"),
    cel("bind", "cel.bind(x, 1, x == 1)", "allocated"),
    cel("lists-k8s", "[1, 2].isSorted() && [1, 2].sum() == 3 && [1, 2].min() == 1", "allocated"),
    cel(
        "timestamps",
        "timestamp('2020-01-01T00:00:00Z') < timestamp('2021-01-01T00:00:00Z')",
        "allocated",
    ),
]


LIBRARIES = [
    cel("ip", "ip('10.0.0.1').family() == 4 && ip('::1').isLoopback()", "allocated"),
    cel(
        "ip-predicates",
        "isIP('1.2.3.4') && !isIP('1.2.3') && ip.isCanonical('10.0.0.1')",
        "allocated",
    ),
    cel(
        "cidr",
        "cidr('10.0.0.0/8').containsIP(ip('10.1.1.1')) && cidr('10.0.0.0/8').prefixLength() == 8",
        "allocated",
    ),
    cel("cidr-contains-cidr", "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')", "allocated"),
    cel(
        "url",
        "url('https://x.io:8443/a?b=c').getHost() == 'x.io:8443' && isURL('https://x')",
        "allocated",
    ),
    cel(
        "url-parts",
        "url('https://x.io:8443/a').getPort() == '8443' && "
        "url('https://x.io/a').getEscapedPath() == '/a'",
        "allocated",
    ),
    cel("ip-bad", "ip('x').family() == 4", "error"),
    cel("cidr-bad", "cidr('x').prefixLength() == 1", "error"),
    cel("url-bad", "url('::').getHost() == ''", "error"),
    cel(
        "lists-ext",
        "[3, 1].sort() == [1, 3] && [[1], [2]].flatten() == [1, 2] && [1, 2, 3].slice(1, 2) == [2]",
        "allocated",
    ),
    cel(
        "lists-ext-3",
        "[1, 1, 2].distinct() == [1, 2] && [1, 2].reverse() == [2, 1] && "
        "lists.range(3) == [0, 1, 2]",
        "allocated",
    ),
    refused(
        "lists-ext-typed-by-element",
        "true in [1, 2].sort()",
        "found no matching overload for '@in' applied to '(bool, list(int))'",
    ),
    cel("lists-ext-dyn-sort", "dyn([2, 1]).sort() == [1, 2]", "allocated"),
    cel("list-index-of", "[1, 2].indexOf(2) == 1 && [1, 2, 1].lastIndexOf(1) == 2", "allocated"),
    cel(
        "string-and-list-index-of", "'abc'.indexOf('c') == 2 && [1, 2].indexOf(2) == 1", "allocated"
    ),
    refused(
        "list-index-of-strings",
        "['a', 'b'].indexOf('b') == 1",
        "Forbidden: too complex, exceeds cost limit",
    ),
    cel("cross-type-numeric-order", "1.5 > 1 && 2 < 2.5 && 1u <= 1", "allocated"),
    cel("cross-type-numeric-order-parenthesized", "((1)) < 2.5 && (2.5 >= (1))", "allocated"),
    cel("semver-parenthesized-equals-computed", f"({VERSION}) == {PRODUCT}", "error"),
    cel("int-plus-double-at-run-time", f"device.attributes['{DRIVER}'].index + 1.5 > 0", "error"),
    cel("string-below-int-at-run-time", f"{PRODUCT} < 5", "error"),
    refused("type-is-too-complex", "type(device.driver) == string", "too complex"),
    refused(
        "result-dyn",
        f"dyn({PRODUCT}.size() > 1)",
        "must evaluate to bool or the unknown type, not dyn",
    ),
    refused("negated-attribute", f"-{PRODUCT}", "not dyn"),
    cel("attribute-as-result", f"device.attributes['{DRIVER}'].index", "error"),
    refused(
        "two-var-over-an-attribute",
        f"{PRODUCT}.all(k, v, v != null)",
        "expression of type 'any' cannot be range of a comprehension",
    ),
    cel("two-var-all", "[1, 2].all(i, v, v > i)", "allocated"),
    cel(
        "two-var-exists",
        "{'a': 1}.exists(k, v, k == 'a' && v == 1) && [5].existsOne(i, v, i == 0)",
        "allocated",
    ),
    cel(
        "two-var-transform-list",
        "[1, 2].transformList(i, v, v * 2) == [2, 4] && "
        "[1, 2].transformList(i, v, i > 0, v) == [2]",
        "allocated",
    ),
    cel(
        "two-var-transform-map",
        "{'a': 1}.transformMap(k, v, v + 1)['a'] == 2 && "
        "[7].transformMapEntry(i, v, {string(v): i}) == {'7': 0}",
        "allocated",
    ),
    cel(
        "format-named",
        "format.named('dns1123Label').hasValue() && !format.named('nope').hasValue() && "
        "format.named('uuid').value() == format.uuid()",
        "allocated",
    ),
    cel("format-named-none-value", "format.named('x').value() == format.byte()", "error"),
    refused(
        "format-validate-is-too-complex",
        "format.dns1123Label().validate('a') == optional.none()",
        "Forbidden: too complex, exceeds cost limit",
    ),
    refused(
        "format-result",
        "format.labelValue()",
        "must evaluate to bool or the unknown type, not kubernetes.NamedFormat",
    ),
    refused(
        "quantity-not-equals-is-too-complex",
        "quantity('1') != quantity('2')",
        "Forbidden: too complex, exceeds cost limit",
    ),
]


BINDING = "DRADeviceBindingConditions=true"


def _binding_case() -> Case:
    """Devices with binding conditions, and their pools, are tried last."""
    objects: list[dict[str, Any]] = []
    for pool, devices in (
        (
            "a",
            [
                {
                    "name": "d0",
                    "bindingConditions": ["ready"],
                    "bindingFailureConditions": ["failed"],
                },
                {"name": "d1"},
            ],
        ),
        ("b", [{"name": "d0"}]),
    ):
        objects.append(
            {
                "apiVersion": V1,
                "kind": "ResourceSlice",
                "metadata": {"name": f"bind-{pool}"},
                "spec": {
                    "driver": "bind.example.com",
                    "nodeName": "n1",
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        )
    select = "device.driver == 'bind.example.com'"
    one = claim(exactly(select, deviceClassName="any"))
    two = claim(exactly(select, deviceClassName="any", count=2))
    two["metadata"] = {"name": "c2", "namespace": "default"}
    return Case(
        "binding-conditions-last",
        [*objects, one, two],
        statuses={"c": "allocated", "c2": "allocated"},
        gates=BINDING,
    )


# ---------------------------------------------------------------- what releases changed

CC_ON = "DRAConsumableCapacity=true"
PC_ON = "DRAPartitionableDevices=true"


def _named(obj: dict[str, Any], name: str) -> dict[str, Any]:
    obj["metadata"] = {"name": name, "namespace": "default"}
    return obj


def _pool_slice(
    name: str,
    devices: list[dict[str, Any]],
    node: dict[str, Any] | None = None,
    driver: str = "x.example.com",
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
        **spec,
    }
    body.update(node if node is not None else {"nodeName": "n1"})
    return {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": body}


def _x(name: str, **attributes: Any) -> dict[str, Any]:
    """A device of x.example.com with typed attributes (``v={"int": 1}``)."""
    return {"name": name, "attributes": attributes}


X_CLASS = {
    "apiVersion": V1,
    "kind": "DeviceClass",
    "metadata": {"name": "x"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'x.example.com'"}}]},
}


def _x_claim(name: str, *requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def _x_request(name: str = "r", **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "x", **body}}


def _counters(
    size: int, *groups: list[str] | None, values: list[int] | None = None
) -> list[dict[str, Any]]:
    """A pool ``p`` on n1 with a counter set ``set`` (c: size) and one device per entry of
    ``groups``, each consuming 1 (with those compatibility groups, if any); attribute
    ``i`` is its index, ``v`` the entry of ``values``."""
    devices = []
    for i, group in enumerate(groups):
        consumption: dict[str, Any] = {"counterSet": "set", "counters": {"c": {"value": "1"}}}
        if group:
            consumption["compatibilityGroups"] = group
        attributes: dict[str, Any] = {"i": {"int": i}}
        if values is not None:
            attributes["v"] = {"int": values[i]}
        devices.append(
            {"name": f"d{i}", "attributes": attributes, "consumesCounters": [consumption]}
        )
    pool = {"name": "p", "generation": 1, "resourceSliceCount": 2}
    spec = {"driver": "x.example.com", "nodeName": "n1", "pool": pool}
    counter = {**spec, "sharedCounters": [{"name": "set", "counters": {"c": {"value": str(size)}}}]}
    return [
        {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": "p-c"}, "spec": counter},
        {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": "p-d"},
         "spec": {**spec, "devices": devices}},
    ]  # fmt: skip


def _releases() -> list[Case]:
    never = {"key": "example.com/excluded", "operator": "DoesNotExist"}
    selector = {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [never]}]}}
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
    shared = [
        {"name": f"gpu-{i}", "allowMultipleAllocations": True,
         "capacity": {"memory": {"value": "8Gi", "requestPolicy": policy}}}
        for i in range(2)
    ]  # fmt: skip
    fractional = {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "capacity": {
            "compute": {
                "value": "1",
                "requestPolicy": {
                    "default": "0.25",
                    "validRange": {"min": "0.25", "max": "1", "step": "0.25"},
                },
            }
        },
    }
    third = _x_request(capacity={"requests": {"compute": "0.3"}})
    rule: dict[str, Any] = {
        "apiVersion": V1,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "maintenance"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "device": "gpu-0"},
            "taint": {"key": "example.com/maint", "effect": "NoSchedule"},
        },
    }
    rule_35 = {**rule, "apiVersion": "resource.k8s.io/v1alpha3"}
    numa = [
        _x("a", numa={"ints": [0, 1]}, kind={"string": "gpu"}),
        _x("b", numa={"ints": [1]}, kind={"string": "gpu"}),
        _x("c", numa={"ints": [0]}, kind={"string": "gpu"}),
    ]
    lists = "DRAListTypeAttributes=true"
    return [
        # pools.py node_matches: with no node at all, a DoesNotExist selector matches
        # (upstream's unnamed node has no labels); gpudra said unschedulable.
        Case(
            "does-not-exist-selector-without-nodes",
            [X_CLASS, _pool_slice("everywhere", [_x("a")], selector), _x_claim("c", _x_request())],
            statuses={"c": "allocated"},
            base=False,
            compare_allocations=True,
        ),
        Case(
            "not-in-selector-without-nodes",
            [
                X_CLASS,
                _pool_slice(
                    "everywhere",
                    [_x("a")],
                    {
                        "nodeSelector": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "zone", "operator": "NotIn", "values": ["z1"]}
                                    ]
                                }
                            ]
                        }
                    },
                ),
                _x_claim("c", _x_request()),
            ],
            statuses={"c": "allocated"},
            base=False,
        ),
        # 1.37 allocateOne: the next device of a request comes after the last (sets);
        # before, every ordering: two shares of one device.
        Case(
            "shares-spread-over-devices",
            [X_CLASS, _pool_slice("shared", shared), _x_claim("c", _x_request(count=2))],
            statuses={"c": "allocated"},
            gates=CC_ON,
            devices_by_minor={
                35: {"c": ["x.example.com/shared/gpu-0", "x.example.com/shared/gpu-0"]},
                37: {"c": ["x.example.com/shared/gpu-0", "x.example.com/shared/gpu-1"]},
            },
        ),
        # allocateDevice up to 1.35 keeps the counters of a device a constraint rejects,
        # so the search runs out of counters before it finds d0 and d2 (1.37 does).
        Case(
            "constraint-rejection-gives-counters-back",
            [
                X_CLASS,
                *_counters(2, None, None, None, values=[1, 2, 1]),
                _x_claim(
                    "c",
                    _x_request(count=2),
                    constraints=[{"matchAttribute": "x.example.com/v"}],
                ),
            ],
            gates=PC_ON,
            by_minor={35: {"c": "unschedulable"}, 37: {"c": "allocated"}},
            devices_by_minor={
                35: {"c": []},
                37: {"c": ["x.example.com/p/d0", "x.example.com/p/d2"]},
            },
        ),
        # distinctAttribute up to 1.36 keeps one value per request name.
        Case(
            "distinct-attribute-per-request",
            [
                X_CLASS,
                _pool_slice(
                    "p",
                    [_x("x", v={"int": 1}), _x("y", v={"int": 2}), _x("z", v={"int": 1})],
                ),
                _x_claim(
                    "c",
                    _x_request("r", count=2),
                    _x_request("q"),
                    constraints=[{"distinctAttribute": "x.example.com/v"}],
                ),
            ],
            gates=CC_ON,
            by_minor={35: {"c": "allocated"}, 37: {"c": "unschedulable"}},
        ),
        # 1.37 Allocate: a config for every request is added once, with requests emptied.
        Case(
            "claim-config-naming-every-request",
            [
                X_CLASS,
                _pool_slice("p", [_x("a"), _x("b")]),
                _x_claim(
                    "c",
                    _x_request("r"),
                    _x_request("q"),
                    config=[
                        {
                            "requests": ["r", "q"],
                            "opaque": {"driver": "x.example.com", "parameters": {"a": 1}},
                        }
                    ],
                ),
            ],
            statuses={"c": "allocated"},
            compare_allocations=True,
        ),
        # 1.37 validateDeviceRequest: "All" keeps a device whose capacity is in use.
        Case(
            "all-with-capacity-in-use",
            [
                X_CLASS,
                _pool_slice("shared", shared),
                _named(_x_claim("c1", _x_request(capacity={"requests": {"memory": "6Gi"}})), "c1"),
                _named(
                    _x_claim(
                        "c2",
                        _x_request(allocationMode="All", capacity={"requests": {"memory": "4Gi"}}),
                    ),
                    "c2",
                ),
            ],
            gates=CC_ON,
            by_minor={
                35: {"c1": "allocated", "c2": "allocated"},
                37: {"c1": "allocated", "c2": "unschedulable"},
            },
        ),
        # 1.37 roundUpRange: with DRAFractionalCapacityRange, milli steps.
        Case(
            "fractional-capacity-range",
            [
                X_CLASS,
                _pool_slice("frac", [fractional]),
                _named(_x_claim("c1", third), "c1"),
                _named(_x_claim("c2", third), "c2"),
            ],
            gates_by_minor={
                35: CC_ON,
                37: f"{CC_ON},DRAFractionalCapacityRange=true",
            },
            statuses={"c1": "allocated", "c2": "allocated"},
            by_minor={35: {"c1": "allocated", "c2": "unschedulable"}},
            compare_allocations=True,
        ),
        Case(
            "fractional-capacity-range-off",
            [
                X_CLASS,
                _pool_slice("frac", [fractional]),
                _named(_x_claim("c1", third), "c1"),
                _named(_x_claim("c2", third), "c2"),
            ],
            gates=f"{CC_ON},DRAFractionalCapacityRange=false",
            statuses={"c1": "allocated", "c2": "unschedulable"},
            minors=(37,),
            compare_allocations=True,
        ),
        # The scheduler's slice tracker applies DeviceTaintRules (on by default in 1.37).
        Case(
            "device-taint-rule",
            [rule, claim(exactly())],
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": [f"{DRIVER}/n1/gpu-1"]},
        ),
        Case(
            "device-taint-rule-gate-off",
            [rule, claim(exactly())],
            gates="DRADeviceTaintRules=false",
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": [f"{DRIVER}/n1/gpu-0"]},
        ),
        Case(
            "device-taint-rule-1-35",
            [rule_35, claim(exactly())],
            gates="DRADeviceTaints=true,DRADeviceTaintRules=true",
            statuses={"c": "allocated"},
            minors=(35,),
            devices={"c": [f"{DRIVER}/n1/gpu-1"]},
        ),
        Case(
            "device-taint-rule-tolerated",
            [
                rule,
                claim(exactly(tolerations=[{"key": "example.com/maint", "operator": "Exists"}])),
            ],
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": [f"{DRIVER}/n1/gpu-0"]},
        ),
        # Up to 1.36 a rule without deviceSelector taints every device; from 1.37 none.
        Case(
            "device-taint-rule-without-selector",
            [{**rule, "spec": {"taint": rule["spec"]["taint"]}}, claim(exactly())],
            statuses={"c": "allocated"},
            minors=(37,),
        ),
        Case(
            "device-taint-rule-without-selector-1-35",
            [{**rule_35, "spec": {"taint": rule["spec"]["taint"]}}, claim(exactly())],
            gates="DRADeviceTaints=true,DRADeviceTaintRules=true",
            statuses={"c": "unschedulable"},
            minors=(35,),
        ),
        # DRAListTypeAttributes: CEL sees lists; constraints compare sets (1.37).
        Case(
            "list-attribute-selector",
            [
                X_CLASS,
                _pool_slice("p", numa),
                _x_claim(
                    "c",
                    _x_request(
                        count=2,
                        selectors=[
                            {
                                "cel": {
                                    "expression": "device.attributes['x.example.com']"
                                    ".numa.includes(0)"
                                }
                            }
                        ],
                    ),
                ),
            ],
            gates=lists,
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": ["x.example.com/p/a", "x.example.com/p/c"]},
        ),
        Case(
            "list-attribute-match-as-sets",
            [
                X_CLASS,
                _pool_slice("p", numa),
                _x_claim(
                    "c", _x_request(count=2), constraints=[{"matchAttribute": "x.example.com/numa"}]
                ),
            ],
            gates=lists,
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": ["x.example.com/p/a", "x.example.com/p/b"]},
        ),
        Case(
            "list-attribute-distinct-as-sets",
            [
                X_CLASS,
                _pool_slice("p", numa),
                _x_claim(
                    "c",
                    _x_request(count=2),
                    constraints=[{"distinctAttribute": "x.example.com/numa"}],
                ),
            ],
            gates=f"{lists},{CC_ON}",
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": ["x.example.com/p/b", "x.example.com/p/c"]},
        ),
        Case(
            "list-attribute-refused-with-the-gate-off",
            [X_CLASS, _pool_slice("p", numa)],
            rc=2,
            says="exactly one value must be specified",
            minors=(37,),
        ),
        # DRADerivedAttributes: a constraint on an attribute the request computes.
        Case(
            "derived-attribute-constraint",
            [
                X_CLASS,
                _pool_slice("p", [_x(f"d{i}", i={"int": i}) for i in range(4)]),
                _x_claim(
                    "c",
                    _x_request(
                        count=2,
                        selectors=[
                            {"cel": {"expression": "device.attributes['x.example.com'].i > 0"}}
                        ],
                        derivedAttributes=[
                            {
                                "name": "x.example.com/half",
                                "expression": "device.attributes['x.example.com'].i / 2",
                            }
                        ],
                    ),
                    constraints=[{"matchAttribute": "x.example.com/half"}],
                ),
            ],
            gates="DRADerivedAttributes=true",
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": ["x.example.com/p/d2", "x.example.com/p/d3"]},
        ),
        Case(
            "derived-attribute-error-stops-the-claim",
            [
                X_CLASS,
                _pool_slice("p", [_x("d0", i={"int": 0}), _x("d1")]),
                _x_claim(
                    "c",
                    _x_request(
                        count=2,
                        derivedAttributes=[
                            {
                                "name": "x.example.com/twice",
                                "expression": "device.attributes['x.example.com'].i * 2",
                            }
                        ],
                    ),
                    constraints=[{"matchAttribute": "x.example.com/twice"}],
                ),
            ],
            gates="DRADerivedAttributes=true",
            statuses={"c": "error"},
            minors=(37,),
        ),
        # DRADeviceCompatibilityGroups: partitions of one counter set must share a group.
        Case(
            "compatibility-groups-disjoint",
            [X_CLASS, *_counters(3, ["a"], ["b"]), _x_claim("c", _x_request(count=2))],
            gates="DRADeviceCompatibilityGroups=true",
            statuses={"c": "unschedulable"},
            minors=(37,),
        ),
        Case(
            "compatibility-groups-shared",
            [X_CLASS, *_counters(3, ["a"], ["b"], ["a", "b"]), _x_claim("c", _x_request(count=2))],
            gates="DRADeviceCompatibilityGroups=true",
            statuses={"c": "allocated"},
            minors=(37,),
            devices={"c": ["x.example.com/p/d0", "x.example.com/p/d2"]},
        ),
        # DRAOptionalNodeOperations: the node must declare the feature; the results say
        # which node operations are skipped.
        Case(
            "optional-node-operations-undeclared",
            [
                X_CLASS,
                _pool_slice("p", [_x("a")], skipNodeOperations=["*"]),
                _x_claim("c", _x_request()),
            ],
            gates="DRAOptionalNodeOperations=true",
            statuses={"c": "unschedulable"},
            minors=(37,),
        ),
        Case(
            "optional-node-operations-declared",
            [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": "n1"},
                    "status": {"declaredFeatures": ["DRAOptionalNodeOperations"]},
                },
                X_CLASS,
                _pool_slice("p", [_x("a")], skipNodeOperations=["*"]),
                _x_claim("c", _x_request()),
            ],
            gates="DRAOptionalNodeOperations=true",
            statuses={"c": "allocated"},
            minors=(37,),
            compare_allocations=True,
        ),
    ]


def _releases_1_34() -> list[Case]:
    """What only Kubernetes 1.34 does with a claim or slice it accepts."""
    kept = claim(exactly(), {"constraints": [{"distinctAttribute": "gpu.example.com/nothere"}]})
    counters = [{"counterSet": "set", "counters": {"c": {"value": "1"}}}]
    pool = {"name": "p", "generation": 1, "resourceSliceCount": 2}
    bound = {
        "name": "a",
        "consumesCounters": counters,
        "bindingConditions": ["example.com/ready"],
        "bindingFailureConditions": ["example.com/failed"],
    }
    binding = {
        "driver": "x.example.com",
        "pool": pool,
        "nodeName": "n1",
        "devices": [bound],
        "sharedCounters": [{"name": "set", "counters": {"c": {"value": "1"}}}],
    }
    plain = {"driver": "x.example.com", "pool": pool, "nodeName": "n1", "devices": [_x("b")]}
    return [
        # 1.34's claim strategy drops distinctAttribute from a copy of each constraint, so
        # the field stays: the experimental allocator (DRAResourceClaimDeviceStatus on)
        # applies it, incubating fails the claim ("empty constraint"). (1.35 drops it and
        # refuses the empty constraint: test_allocator_api_rules.RULES_1_34.)
        Case(
            "distinct-attribute-kept-with-consumable-capacity-off",
            [kept],
            statuses={"c": "unschedulable"},
            minors=(34,),
        ),
        Case(
            "distinct-attribute-unknown-to-the-incubating-allocator",
            [kept],
            gates="DRAResourceClaimDeviceStatus=false",
            statuses={"c": "error"},
            minors=(34,),
        ),
        # GatherPools 1.34 puts every slice with binding conditions after the others of
        # its pool, one that also holds counter sets included (1.35 adds those at once).
        Case(
            "binding-slice-with-counter-sets-last",
            [
                X_CLASS,
                {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": "a"},
                 "spec": binding},
                {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": "b"},
                 "spec": plain},
                _x_claim("c", _x_request()),
            ],
            gates="DRAPartitionableDevices=true,DRADeviceBindingConditions=true",
            statuses={"c": "allocated"},
            minors=(34,),
            base=False,
            devices={"c": ["x.example.com/p/b"]},
        ),
    ]  # fmt: skip


RELEASES = _releases() + _releases_1_34()
CASES = [*VALIDATION, *OUTCOMES, *LIBRARIES, _binding_case(), *RELEASES]


# ---------------------------------------------------------------- deviations


@dataclass(frozen=True)
class Deviation:
    """Where upstream has a bug and gpudra keeps the correct outcome
    (docs/differences.md, "The allocator against kube-scheduler")."""

    name: str
    objects: list[dict[str, Any]]
    ours: dict[str, str]  # claim -> status
    reference: dict[str, str]  # what upstream gives before ``fixed_in``
    gates: str = ""
    fixed_in: int = 37  # the first release whose upstream gives our outcome
    also: tuple[int, ...] = ()  # releases beyond MINORS that show it (it is fixed in those)

    @property
    def minors(self) -> tuple[int, ...]:
        return (*MINORS, *self.also)

    def reference_for(self, minor: int) -> dict[str, str]:
        return self.ours if minor >= self.fixed_in else self.reference


def _slice(
    name: str, driver: str, devices: list[dict[str, Any]], counters: bool = False
) -> list[dict[str, Any]]:
    """One pool ``p`` on n1; with ``counters``, a counter set ``set`` (c: 1) in a second slice."""
    pool = {"name": "p", "generation": 1, "resourceSliceCount": 2 if counters else 1}
    spec = {"driver": driver, "nodeName": "n1", "pool": pool, "devices": devices}
    out = [{"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}]
    if counters:
        shared = {
            "driver": driver,
            "allNodes": True,
            "pool": pool,
            "sharedCounters": [{"name": "set", "counters": {"c": {"value": "1"}}}],
        }
        meta = {"name": f"{name}-counters"}
        out.append({"apiVersion": V1, "kind": "ResourceSlice", "metadata": meta, "spec": shared})
    return out


def _any(name: str, *selectors: str, **fields: Any) -> dict[str, Any]:
    request = exactly(None, deviceClassName="any", **fields)
    if selectors:
        request["exactly"]["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    out = claim(request)
    out["metadata"] = {"name": name, "namespace": "default"}
    return out


_CONSUMES = [{"counterSet": "set", "counters": {"c": {"value": "1"}}}]
_BIG = "100000000000000000000"  # beyond int64: held as inf.Dec upstream
_MEMORY = "device.capacity['d.example.com'].memory"
_ADD = f"{_MEMORY}.add(quantity('10Gi')).compareTo(quantity('1Gi')) > 0"


def _deviations() -> list[Deviation]:
    later_all = claim(
        {
            "name": "r",
            "firstAvailable": [
                {
                    "name": "s0",
                    "deviceClassName": "any",
                    "allocationMode": "All",
                    "selectors": [
                        {"cel": {"expression": "device.attributes['d.example.com'].i == 5"}}
                    ],
                },
                {
                    "name": "s1",
                    "deviceClassName": "any",
                    "allocationMode": "All",
                    "selectors": [
                        {"cel": {"expression": "device.attributes['d.example.com'].i >= 0"}}
                    ],
                },
            ],
        }
    )
    indexed = [{"name": n, "attributes": {"i": {"int": i}}} for i, n in enumerate("xy")]
    big = [
        {"name": n, "attributes": {"i": {"int": i}}, "capacity": {"memory": {"value": _BIG}}}
        for i, n in enumerate("xy")
    ]
    pc = "DRAPartitionableDevices=true"
    shared = {"name": "x", "allowMultipleAllocations": True, "consumesCounters": _CONSUMES}
    memory = {"memory": {"value": "80Gi"}}
    capacities = [
        {"name": "x0", "capacity": memory},
        {"name": "x1", "capacity": {"other": {"value": "1"}}},
        {"name": "x2", "capacity": memory},
    ]
    alike = [{"name": n, "attributes": {"s": {"string": "same"}}} for n in "xy"]
    twice = _any("c", count=2)
    twice["spec"]["devices"]["constraints"] = [{"distinctAttribute": "d.example.com/s"}]
    return [
        # structured/internal/experimental allocator_experimental.go allocateOne: after
        # the first device of an "All" subrequest it recurses with subRequestIndex 0.
        Deviation(
            "later-all-subrequest-keeps-its-selectors",
            [*_slice("s", "d.example.com", indexed), later_all],
            ours={"c": "allocated"},
            reference={"c": "unschedulable"},
            fixed_in=36,  # allocateOne passes r.subRequestIndex
        ),
        # k8s.io/apiserver/pkg/cel/library/quantity.go quantityAdd: `copy := *q` is
        # shallow, so Add changes the device's own inf.Dec value.
        Deviation(
            "quantity-add-leaves-the-device-alone",
            [
                *_slice("s", "d.example.com", big),
                _any("c1", f"{_ADD} && device.attributes['d.example.com'].i == 1"),
                _any("c2", f"{_MEMORY}.compareTo(quantity('{_BIG}')) == 0"),
            ],
            ours={"c1": "allocated", "c2": "allocated"},
            reference={"c1": "allocated", "c2": "unschedulable"},
            fixed_in=37,  # quantityAdd: q.DeepCopy()
        ),
        # allocator_experimental.go checkAvailableCounters: availableCounters and
        # consumedCounters are keyed by pool.PoolID.Pool, the pool name alone.
        Deviation(
            "counters-of-two-drivers-with-one-pool-name",
            [
                *_slice("a", "a.example.com", [{"name": "x", "consumesCounters": _CONSUMES}], True),
                *_slice("b", "b.example.com", [{"name": "x", "consumesCounters": _CONSUMES}], True),
                claim(
                    {
                        "name": "a",
                        "exactly": {
                            "deviceClassName": "any",
                            "selectors": [
                                {"cel": {"expression": "device.driver == 'a.example.com'"}}
                            ],
                        },
                    },
                    {
                        "requests": [
                            {
                                "name": "a",
                                "exactly": {
                                    "deviceClassName": "any",
                                    "selectors": [
                                        {"cel": {"expression": "device.driver == 'a.example.com'"}}
                                    ],
                                },
                            },
                            {
                                "name": "b",
                                "exactly": {
                                    "deviceClassName": "any",
                                    "selectors": [
                                        {"cel": {"expression": "device.driver == 'b.example.com'"}}
                                    ],
                                },
                            },
                        ]
                    },
                ),
            ],
            ours={"c": "allocated"},
            reference={"c": "unschedulable"},
            gates=pc,
            fixed_in=37,  # availableCounters keyed by PoolID
        ),
        # kube-scheduler's allocated-device tracking (dynamicresources
        # foreachAllocatedDevice) counts a shared result by share ID only, and the
        # allocator's counter check reads AllocatedDevices: a share consumes no counters.
        Deviation(
            "a-shared-device-consumes-its-counters",
            [
                *_slice(
                    "s",
                    "d.example.com",
                    [shared, {"name": "y", "consumesCounters": _CONSUMES}],
                    True,
                ),
                _any("c1", "device.allowMultipleAllocations"),
                _any("c2", "!device.allowMultipleAllocations"),
            ],
            ours={"c1": "allocated", "c2": "unschedulable"},
            reference={"c1": "allocated", "c2": "allocated"},
            gates=f"{pc},DRAConsumableCapacity=true",
            fixed_in=36,  # checkAvailableCounters asks IsDeviceAllocated
        ),
        # 1.34 allocator_experimental.go allocateDevice: CmpRequestOverCapacity(...,
        # r.deviceIndex) takes the device's index within the request for its index in
        # the slice, so the second device's capacity is x1's (no memory): refused.
        Deviation(
            "capacity-checked-on-the-device-itself",
            [
                *_slice("s", "d.example.com", capacities),
                _any("c", f"has({_MEMORY})", count=2, capacity={"requests": {"memory": "4Gi"}}),
            ],
            ours={"c": "allocated"},
            reference={"c": "unschedulable"},
            gates="DRAConsumableCapacity=true",
            fixed_in=35,  # passes the device itself
            also=(34,),
        ),
        # 1.34 constraint.go distinctAttributeConstraint.matchesAttribute compares the
        # values' pointers, so two devices with one value are never duplicates.
        Deviation(
            "distinct-attribute-compares-values",
            [*_slice("s", "d.example.com", alike), twice],
            ours={"c": "unschedulable"},
            reference={"c": "allocated"},
            gates="DRAConsumableCapacity=true",
            fixed_in=35,  # compares *StringValue and the other values
            also=(34,),
        ),
    ]


DEVIATIONS = _deviations()
