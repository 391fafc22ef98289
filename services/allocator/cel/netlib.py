"""Kubernetes' IP, CIDR and URL CEL libraries (k8s.io/apiserver/pkg/cel/library ip.go,
cidr.go, urls.go), which the 1.35 environment gives DRA selectors.

Values are protobuf messages holding their text (types.py's pool, named
``net.IP``, ``net.CIDR`` and ``kubernetes.URL`` as in Kubernetes), so equality
compares canonical forms. Parse errors are worded as Kubernetes words them.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from cel_expr_python import cel

from services.allocator.cel import types as celtypes

IP = cel.Type(celtypes.IP_TYPE)
CIDR = cel.Type(celtypes.CIDR_TYPE)
URL = cel.Type(celtypes.URL_TYPE)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


# ---------------------------------------------------------------- ip


def _parse_ip(text: str) -> Address:
    if "%" in text:
        raise ValueError(f"IP address with zone value is not allowed: {text}")
    try:
        address = ipaddress.ip_address(text)
    except ValueError as exc:
        raise ValueError(
            f'IP Address "{text}" parse error during conversion from string: '
            f'ParseAddr("{text}"): unable to parse IP'
        ) from exc
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {text}")
    return address


def _ip(text: str) -> Any:
    return celtypes.IPMessage(text=str(_parse_ip(text)))


def _addr(message: Any) -> Address:
    return ipaddress.ip_address(message.text)


def _is_ip(text: str) -> bool:
    try:
        _parse_ip(text)
    except ValueError:
        return False
    return True


def _is_canonical(text: str) -> bool:
    return str(_parse_ip(text)) == text


def _global_unicast(message: Any) -> bool:
    """Go's netip.Addr.IsGlobalUnicast: not unspecified, loopback, multicast,
    link-local or the IPv4 broadcast address (private addresses count)."""
    address = _addr(message)
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        return False
    if address.is_link_local or str(address) == "255.255.255.255":
        return False
    return True


# ---------------------------------------------------------------- cidr


def _parse_cidr(text: str) -> Network:
    if "/" not in text:
        raise ValueError(
            "network address parse error during conversion from string: network address "
            f"parse error during conversion from string: netip.ParsePrefix(\"{text}\"): no '/'"
        )
    address, _, _ = text.partition("/")
    _parse_ip(address)
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise ValueError(
            f"network address parse error during conversion from string: {exc}"
        ) from exc


def _cidr(text: str) -> Any:
    _parse_cidr(text)
    return celtypes.CIDRMessage(text=text)


def _net(message: Any) -> tuple[Address, Network]:
    address, _, _ = message.text.partition("/")
    return ipaddress.ip_address(address), ipaddress.ip_network(message.text, strict=False)


def _is_cidr(text: str) -> bool:
    try:
        _parse_cidr(text)
    except ValueError:
        return False
    return True


def _contains_ip(message: Any, other: Any) -> bool:
    address = _parse_ip(other) if isinstance(other, str) else _addr(other)
    network = _net(message)[1]
    return address.version == network.version and address in network


def _contains_cidr(message: Any, other: Any) -> bool:
    inner = _parse_cidr(other) if isinstance(other, str) else _net(other)[1]
    outer = _net(message)[1]
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


def _cidr_ip(message: Any) -> Any:
    return celtypes.IPMessage(text=str(_net(message)[0]))


def _masked(message: Any) -> Any:
    return celtypes.CIDRMessage(text=str(_net(message)[1]))


# ---------------------------------------------------------------- url


def _parse_url(text: str) -> Any:
    parts = urlsplit(text)
    if not parts.scheme or not (parts.netloc or text.startswith(f"{parts.scheme}:/")):
        raise ValueError(
            f'URL parse error during conversion from string: parse "{text}": '
            "missing protocol scheme"
        )
    return parts


def _url(text: str) -> Any:
    _parse_url(text)
    return celtypes.URLMessage(text=text)


def _is_url(text: str) -> bool:
    try:
        _parse_url(text)
    except ValueError:
        return False
    return True


def _u(message: Any) -> Any:
    return urlsplit(message.text)


def _hostname(message: Any) -> str:
    host = _u(message).netloc.rpartition("@")[2]
    if host.startswith("["):
        return str(host[1 : host.index("]")])
    return str(host.rpartition(":")[0] if ":" in host else host)


def _port(message: Any) -> str:
    host = _u(message).netloc.rpartition("@")[2]
    tail = host[host.index("]") + 1 :] if host.startswith("[") else host
    return tail.rpartition(":")[2] if ":" in tail else ""


def _query(message: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for pair in filter(None, _u(message).query.split("&")):
        key, _, value = pair.partition("=")
        out.setdefault(key, []).append(value)
    return out


# ---------------------------------------------------------------- declarations


def _decl(name: str, oid: str, ret: Any, params: list[Any], member: bool, impl: Any) -> Any:
    return cel.FunctionDecl(name, [cel.Overload(oid, ret, params, is_member=member, impl=impl)])


def functions() -> list[Any]:
    """The IP, CIDR and URL declarations."""
    b, i, s = cel.Type.BOOL, cel.Type.INT, cel.Type.STRING
    query = cel.Type.Map(s, cel.Type.List(s))
    return [
        cel.FunctionDecl(
            "ip",
            [
                cel.Overload("string_to_ip", IP, [s], is_member=False, impl=_ip),
                cel.Overload("cidr_ip", IP, [CIDR], is_member=True, impl=_cidr_ip),
            ],
        ),
        _decl("isIP", "is_ip", b, [s], False, _is_ip),
        _decl("ip.isCanonical", "ip_is_canonical", b, [s], False, _is_canonical),
        _decl("family", "ip_family", i, [IP], True, lambda m: _addr(m).version),
        _decl(
            "isUnspecified", "ip_is_unspecified", b, [IP], True, lambda m: _addr(m).is_unspecified
        ),
        _decl("isLoopback", "ip_is_loopback", b, [IP], True, lambda m: _addr(m).is_loopback),
        _decl(
            "isLinkLocalMulticast",
            "ip_is_link_local_multicast",
            b,
            [IP],
            True,
            lambda m: (
                (_addr(m).is_multicast and _addr(m).is_link_local)
                or (_addr(m).version == 4 and str(_addr(m)).startswith("224.0.0."))
            ),
        ),
        _decl(
            "isLinkLocalUnicast",
            "ip_is_link_local_unicast",
            b,
            [IP],
            True,
            lambda m: _addr(m).is_link_local and not _addr(m).is_multicast,
        ),
        _decl("isGlobalUnicast", "ip_is_global_unicast", b, [IP], True, _global_unicast),
        _decl("cidr", "string_to_cidr", CIDR, [s], False, _cidr),
        _decl("isCIDR", "is_cidr", b, [s], False, _is_cidr),
        cel.FunctionDecl(
            "containsIP",
            [
                cel.Overload(
                    "cidr_contains_ip_string", b, [CIDR, s], is_member=True, impl=_contains_ip
                ),
                cel.Overload(
                    "cidr_contains_ip_ip", b, [CIDR, IP], is_member=True, impl=_contains_ip
                ),
            ],
        ),
        cel.FunctionDecl(
            "containsCIDR",
            [
                cel.Overload(
                    "cidr_contains_cidr_string", b, [CIDR, s], is_member=True, impl=_contains_cidr
                ),
                cel.Overload(
                    "cidr_contains_cidr", b, [CIDR, CIDR], is_member=True, impl=_contains_cidr
                ),
            ],
        ),
        _decl("masked", "cidr_masked", CIDR, [CIDR], True, _masked),
        _decl(
            "prefixLength", "cidr_prefix_length", i, [CIDR], True, lambda m: _net(m)[1].prefixlen
        ),
        _decl("url", "string_to_url", URL, [s], False, _url),
        _decl("isURL", "is_url", b, [s], False, _is_url),
        _decl("getScheme", "url_get_scheme", s, [URL], True, lambda m: _u(m).scheme),
        _decl("getHost", "url_get_host", s, [URL], True, lambda m: _u(m).netloc.rpartition("@")[2]),
        _decl("getHostname", "url_get_hostname", s, [URL], True, _hostname),
        _decl("getPort", "url_get_port", s, [URL], True, _port),
        _decl("getEscapedPath", "url_get_escaped_path", s, [URL], True, lambda m: _u(m).path),
        _decl("getQuery", "url_get_query", query, [URL], True, _query),
    ]
