"""The SONAME of a shared object, read from its ELF dynamic section.

The toolkit asks each versioned driver library for its SONAME (Go's
``debug/elf``) to decide which ``<soname> -> <file>`` link the container
needs; this reads the same field without loading the library.
"""

from __future__ import annotations

import os
import struct

_SHT_DYNAMIC = 6
_DT_NULL = 0
_DT_SONAME = 14


class ElfError(ValueError):
    """Not an ELF file we can read (the message names the file and the problem)."""


def soname(path: str) -> str:
    """DT_SONAME of ``path``; its file name when it has none (as the toolkit does)."""
    try:
        names = _dyn_strings(path, _DT_SONAME)
    except struct.error as exc:
        raise ElfError(f"{path}: truncated ELF file ({exc})") from None
    if len(names) > 1:
        raise ElfError(f"{path}: {len(names)} SONAMEs ({', '.join(names)})")
    return names[0] if names else os.path.basename(path)


def _dyn_strings(path: str, tag: int) -> list[str]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise ElfError(f"{path}: not an ELF file")
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(endian + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
    else:
        (shoff,) = struct.unpack_from(endian + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x2E)
    sections = [_section(data, endian, is64, shoff + i * shentsize) for i in range(shnum)]
    for sh_type, offset, size, link in sections:
        if sh_type != _SHT_DYNAMIC:
            continue
        if link >= len(sections):
            raise ElfError(f"{path}: dynamic section links to section {link} of {len(sections)}")
        str_off, str_size = sections[link][1], sections[link][2]
        return [
            _cstring(data, str_off + value, str_off + str_size, path)
            for d_tag, value in _entries(data, endian, is64, offset, size)
            if d_tag == tag
        ]
    return []


def _section(data: bytes, endian: str, is64: bool, at: int) -> tuple[int, int, int, int]:
    if is64:
        _, sh_type, _, _, offset, size, link = struct.unpack_from(endian + "IIQQQQI", data, at)
    else:
        _, sh_type, _, _, offset, size, link = struct.unpack_from(endian + "IIIIIII", data, at)
    return sh_type, offset, size, link


def _entries(data: bytes, endian: str, is64: bool, offset: int, size: int) -> list[tuple[int, int]]:
    fmt, step = (endian + "qQ", 16) if is64 else (endian + "iI", 8)
    out = []
    for at in range(offset, min(offset + size, len(data) - step + 1), step):
        d_tag, value = struct.unpack_from(fmt, data, at)
        if d_tag == _DT_NULL:
            break
        out.append((d_tag, value))
    return out


def _cstring(data: bytes, start: int, end: int, path: str) -> str:
    stop = data.find(b"\0", start, end)
    if start >= len(data) or stop < 0:
        raise ElfError(f"{path}: string table entry at {start} is not terminated")
    return data[start:stop].decode(errors="replace")
