"""Kubernetes' ``format`` CEL library (k8s.io/apiserver/pkg/cel/library/format.go).

The 1.35 environment declares it from compatibility version 1.31
(k8s.io/apiserver/pkg/cel/environment/base.go), so DRA selectors have it:
``format.named(name)`` (an ``optional`` Format), ``format.dns1123Label()`` and
the other named formats, and ``<Format>.validate(s)``: ``optional.none()`` when
``s`` is valid, else the validator's messages (services/core/kube/names.py, the
strfmt checks and Go's ``url.ParseRequestURI`` below, word for word).

cel-expr-python cannot declare or return an optional value from Python, so
macros.py rewrites ``format.named(x)`` into
``optional.ofNonZeroValue(__k8s_format_named(x))`` (an unknown name gives the
empty Format, hence ``none``) and ``f.validate(s)`` into
``optional.ofNonZeroValue(__k8s_format_validate(f, s))`` (no messages: none).

Kubernetes estimates ``validate`` from the size of the Format, which it does
not know, so every selector that calls it is over the cost limit (cost.py):
the API server refuses it, whatever the string.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable
from typing import Any

from cel_expr_python import cel

from services.allocator.cel import types as celtypes
from services.core.kube import names

FORMAT = cel.Type(celtypes.FORMAT_TYPE)
NAMED = "__k8s_format_named"
VALIDATE = "__k8s_format_validate"


def _prefix(validator: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """apimachinery's NameIs*(name, prefix=true): a trailing dash is masked (its
    maskTrailingDash drops the two last characters and appends an ``a``)."""

    def validate(value: str) -> list[str]:
        if len(value) > 1 and value.endswith("-"):
            value = value[:-2] + "a"
        return validator(value)

    return validate


_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
_BASE64 = re.compile(
    r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"
)
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")


def _is_date(text: str) -> bool:
    """Go's time.Parse("2006-01-02", text)."""
    if not _DATE.fullmatch(text):
        return False
    try:
        datetime.date(int(text[:4]), int(text[5:7]), int(text[8:]))
    except ValueError:
        return False
    return True


def _is_datetime(text: str) -> bool:
    """kube-openapi strfmt's IsDateTime."""
    if len(text.encode()) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    match = _TIME.fullmatch(parts[1])
    if not match:
        return False
    return match.group(1) <= "23" and match.group(2) <= "59" and match.group(3) <= "59"


def _check(ok: Callable[[str], bool], message: str) -> Callable[[str], list[str]]:
    return lambda value: [] if ok(value) else [message]


# ---------------------------------------------------------------- uri


class _URLError(ValueError):
    pass


_HEX = "0123456789abcdefABCDEF"


def _quote(text: str) -> str:
    """Go's %q, near enough: double quotes, backslash escapes."""
    return json.dumps(text, ensure_ascii=False)


def _unescape(text: str, host: bool) -> None:
    """The checks of Go's url.unescape: every ``%`` is followed by two hex digits,
    and a host holds only the characters Go allows in one."""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%":
            escape = text[i : i + 3]
            if len(escape) < 3 or escape[1] not in _HEX or escape[2] not in _HEX:
                raise _URLError(f"invalid URL escape {_quote(escape)}")
            i += 3
            continue
        if host and char.isascii() and not _host_char(char):
            raise _URLError(f"invalid character {_quote(char)} in host name")
        i += 1


def _host_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char in "-._~!$&'()*+,;=:[]<>\"")


def _userinfo_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char in "-._:~!$&'()*+,;=%@")


def _valid_port(port: str) -> bool:
    """Go's validOptionalPort: empty, or a colon and digits."""
    return port == "" or (port.startswith(":") and all(c in "0123456789" for c in port[1:]))


def _parse_host(host: str) -> None:
    if host.startswith("["):
        end = host.rfind("]")
        if end < 0:
            raise _URLError("missing ']' in host")
        port = host[end + 1 :]
    else:
        port = host[host.rfind(":") :] if ":" in host else ""
    if not _valid_port(port):
        raise _URLError(f"invalid port {_quote(port)} after host")
    _unescape(host, host=True)


def _scheme(text: str) -> tuple[str, str]:
    for i, char in enumerate(text):
        if char.isascii() and char.isalpha():
            continue
        if char.isascii() and (char.isdigit() or char in "+-."):
            if i == 0:
                return "", text
            continue
        if char == ":":
            if i == 0:
                raise _URLError("missing protocol scheme")
            return text[:i], text[i + 1 :]
        return "", text
    return "", text


def _parse_request_uri(text: str) -> None:
    """Go's url.ParseRequestURI, for its errors."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise _URLError("net/url: invalid control character in URL")
    if text == "":
        raise _URLError("empty url")
    if text == "*":
        return
    scheme, rest = _scheme(text)
    if rest.endswith("?") and rest.count("?") == 1:
        rest = rest[:-1]
    else:
        rest = rest.partition("?")[0]
    if not rest.startswith("/"):
        if scheme:
            return  # an opaque URL
        raise _URLError("invalid URI for request")
    if scheme and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        userinfo, at, host = authority.rpartition("@")
        _parse_host(host)
        if at and not all(_userinfo_char(c) for c in userinfo):
            raise _URLError("net/url: invalid userinfo")
    _unescape(rest, host=False)


def _uri(value: str) -> list[str]:
    try:
        _parse_request_uri(value)
    except _URLError as exc:
        return [f"parse {_quote(value)}: {exc}"]
    return []


# ---------------------------------------------------------------- the formats


FORMATS: dict[str, tuple[str, Callable[[str], list[str]]]] = {
    "dns1123Label": ("DNS1123Label", names.dns1123_label),
    "dns1123Subdomain": ("DNS1123Subdomain", names.dns1123_subdomain),
    "dns1035Label": ("DNS1035Label", names.dns1035_label),
    "qualifiedName": ("QualifiedName", names.label_key),
    "dns1123LabelPrefix": ("DNS1123LabelPrefix", _prefix(names.dns1123_label)),
    "dns1123SubdomainPrefix": ("DNS1123SubdomainPrefix", _prefix(names.dns1123_subdomain)),
    "dns1035LabelPrefix": ("DNS1035LabelPrefix", _prefix(names.dns1035_label)),
    "labelValue": ("LabelValue", names.label_value),
    "uri": ("URI", _uri),
    "uuid": ("uuid", _check(lambda v: bool(_UUID.fullmatch(v)), "does not match the UUID format")),
    "byte": ("byte", _check(lambda v: bool(_BASE64.fullmatch(v)), "invalid base64")),
    "date": ("date", _check(_is_date, "invalid date")),
    "datetime": ("datetime", _check(_is_datetime, "invalid datetime")),
}
_BY_NAME = {name: validate for name, validate in FORMATS.values()}


def _format(key: str) -> Any:
    """The Format named ``key``; the empty one (``optional.none()`` once wrapped)
    when there is none."""
    entry = FORMATS.get(key)
    return celtypes.FormatMessage(text=entry[0] if entry else "")


def _validate(message: Any, value: str) -> list[str]:
    return _BY_NAME[message.text](value)


def functions() -> list[Any]:
    """``format.<name>()`` for each format, and the two functions the rewrites call."""
    string = cel.Type.STRING
    decls = [
        cel.FunctionDecl(
            f"format.{key}",
            [
                cel.Overload(
                    f"format.{key}", FORMAT, [], is_member=False, impl=lambda k=key: _format(k)
                )
            ],
        )
        for key in FORMATS
    ]
    decls.append(
        cel.FunctionDecl(
            NAMED, [cel.Overload("format-named", FORMAT, [string], is_member=False, impl=_format)]
        )
    )
    decls.append(
        cel.FunctionDecl(
            VALIDATE,
            [
                cel.Overload(
                    "format-validate",
                    cel.Type.List(string),
                    [FORMAT, string],
                    is_member=False,
                    impl=_validate,
                )
            ],
        )
    )
    return decls
