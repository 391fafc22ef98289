"""Limits on what users can make a service read: nesting depth, claims per request.

msgspec refuses to decode JSON nested deeper than Python's recursion limit
(about 1,000 levels) with a RecursionError, while the API server stores objects
nested 10,000 deep. Such an object must fail on its own, with a message that
names it, not stop the loop that read it. :func:`cap_depth` makes the rest of
the object readable (its metadata, to say which one it was).
"""

from __future__ import annotations

import json

import msgspec

MAX_REPORTED_DEPTH = 32  # cap_depth keeps this many levels when naming an unreadable object
# Claims one kubelet call may name. The API sets no limit on a pod's claims; real pods
# name a handful, so this only stops floods (2,000 unknown claims once cost 8 s of work).
MAX_CLAIMS_PER_REQUEST = 512

_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


class TooDeep(ValueError):
    """An object nested deeper than can be decoded."""


def too_deep(what: str) -> TooDeep:
    return TooDeep(f"{what}: nested too deeply to read (more than about 1,000 levels)")


def cap_depth(raw: bytes | memoryview | msgspec.Raw, limit: int = MAX_REPORTED_DEPTH) -> bytes:
    """``raw`` JSON with every value nested deeper than ``limit`` replaced by ``null``.

    One pass, no recursion, so it works on any depth; strings (escapes
    included) are copied as they are.
    """
    out = bytearray()
    depth = 0
    skip_from = 0  # depth at which the value being dropped started (0: copying)
    in_string = escaped = False
    for byte in bytes(raw):
        if in_string:
            if not skip_from:
                out.append(byte)
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
            continue
        if byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > limit and not skip_from:
                skip_from = depth
                out += b"null"
                continue
        elif byte in _CLOSE:
            depth -= 1
            if skip_from and depth < skip_from:
                skip_from = 0
                continue
        if not skip_from:
            out.append(byte)
    return bytes(out)


def members(raw: bytes | memoryview | msgspec.Raw) -> dict[str, bytes]:
    """A JSON object's members, each value as its own bytes, found without recursion.

    For reading a list or a watch event whose one item is too deep for the
    decoder: the envelope is split here, and each item is decoded (or refused)
    on its own.
    """
    out: dict[str, bytes] = {}
    for key, value in _split(bytes(raw), ord("{")):
        out[json.loads(key)] = value
    return out


def elements(raw: bytes | memoryview | msgspec.Raw) -> list[bytes]:
    """A JSON array's elements, each as its own bytes, found without recursion."""
    return [value for _, value in _split(bytes(raw), ord("["))]


def _split(data: bytes, opener: int) -> list[tuple[bytes, bytes]]:
    start = data.find(bytes([opener]))
    if start < 0:
        raise ValueError("not a JSON " + ("object" if opener == ord("{") else "array"))
    found: list[tuple[bytes, bytes]] = []
    depth, in_string, escaped = 0, False, False
    key, value_start = b"", start + 1
    string_start = 0
    for i in range(start, len(data)):
        byte = data[i]
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
                if depth == 1 and opener == ord("{") and not key:
                    key = data[string_start : i + 1]
            continue
        if byte == _QUOTE:
            in_string = True
            string_start = i
        elif byte in _OPEN:
            depth += 1
        elif byte in _CLOSE or (byte == ord(",") and depth == 1):
            if byte != ord(","):
                depth -= 1
            if depth == 0 or (byte == ord(",") and depth == 1):
                value = data[value_start:i].strip()
                if key:  # an object member: drop its key and the colon
                    value = value[len(key) :].lstrip()[1:].strip()
                if value:
                    found.append((key, value))
                key, value_start = b"", i + 1
                if depth == 0:
                    return found
    raise ValueError("unterminated JSON")
