"""The 64-bit libraries listed in a driver root's ``/etc/ld.so.cache``.

The toolkit falls back to the dynamic linker's cache when a driver library is
not in one of its fixed search directories (glibc's ``glibc-ld.so.cache1.1``
format, possibly after the old ``ld.so-1.7.0`` table); this reads the same file.
"""

from __future__ import annotations

import os
import struct

PATH = "etc/ld.so.cache"
_OLD_MAGIC = b"ld.so-1.7.0"
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_ELF = 0x0001
_ARCH_64 = {0x0300, 0x0A00, 0x0500}  # x86-64, AArch64, ppc64le
_ARCH_32 = {0x0800, 0x0900, 0x0000}  # x32, ARM hard-float, i386
_NEW_HEADER = struct.Struct("<20sII12x8x")  # magic+version, nlibs, table size, unused
_NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_OLD_ENTRY_SIZE = 12


def libraries64(root: str) -> list[str]:
    """Paths (under ``root``) of the cache's 64-bit ELF libraries, first entry wins.

    A missing or malformed cache is an empty list: the toolkit only warns then.
    """
    try:
        with open(os.path.join(root, PATH), "rb") as f:
            data = f.read()
    except OSError:
        return []
    return _parse(data, root)


def _parse(data: bytes, root: str) -> list[str]:
    start = 0
    if data.startswith(_OLD_MAGIC):
        if len(data) < 16:
            return []
        (count,) = struct.unpack_from("<I", data, 12)
        start = 16 + count * _OLD_ENTRY_SIZE
        start += -start & 7  # the new table is 8-byte aligned
    if data[start : start + len(_NEW_MAGIC)] != _NEW_MAGIC:
        return []
    if len(data) < start + _NEW_HEADER.size:
        return []
    _, count, _ = _NEW_HEADER.unpack_from(data, start)
    libs = data[start:]  # string offsets count from the new header
    seen: set[str] = set()
    out: list[str] = []
    for i in range(count):
        at = start + _NEW_HEADER.size + i * _NEW_ENTRY.size
        if at + _NEW_ENTRY.size > len(data):
            break
        flags, key, value, _, _ = _NEW_ENTRY.unpack_from(data, at)
        if not flags & _ELF or flags & 0xFF00 not in _ARCH_64 | _ARCH_32:
            continue
        if flags & 0xFF00 not in _ARCH_64 or key > len(libs) or value > len(libs):
            continue
        name, path = _cstr(libs, key), _cstr(libs, value)
        if not name or not path:
            continue
        full = os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path
        if full not in seen:
            seen.add(full)
            out.append(full)
    return out


def _cstr(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    return "" if end < 0 else data[at:end].decode(errors="replace")
