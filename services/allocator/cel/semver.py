"""Semantic versions exactly as github.com/blang/semver/v4 parses and orders them.

Kubernetes turns every ``version`` device attribute into such a value for CEL
(``semver.Parse``), and its CEL ``semver()`` function uses the same parser, so
the error texts below are blang's.
"""

from __future__ import annotations

from dataclasses import dataclass

_DIGITS = frozenset("0123456789")
_ALNUM = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_UINT64_MAX = 2**64 - 1


class SemverError(ValueError):
    """Not a semantic version."""


def _only(text: str, chars: frozenset[str]) -> bool:
    return all(c in chars for c in text)


def _uint(text: str, what: str) -> int:
    if not _only(text, _DIGITS):
        raise SemverError(f"Invalid character(s) found in {what} number {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise SemverError(f"{what.capitalize()} number must not contain leading zeroes {text!r}")
    if not text:
        raise SemverError('strconv.ParseUint: parsing "": invalid syntax')
    value = int(text)
    if value > _UINT64_MAX:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return value


def _prerelease(part: str) -> int | str:
    if not part:
        raise SemverError("Prerelease is empty")
    if _only(part, _DIGITS):
        if len(part) > 1 and part[0] == "0":
            raise SemverError(
                f"Numeric PreRelease version must not contain leading zeroes {part!r}"
            )
        return _uint(part, "prerelease")
    if _only(part, _ALNUM):
        return part
    raise SemverError(f"Invalid character(s) found in prerelease {part!r}")


@dataclass(frozen=True, slots=True)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Semver:
        """blang's ``semver.Parse``."""
        if not text:
            raise SemverError("Version string empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise SemverError("No Major.Minor.Patch elements found")
        major = _uint(parts[0], "major")
        minor = _uint(parts[1], "minor")
        rest, build_text, pre_text = parts[2], None, None
        if "+" in rest:
            rest, build_text = rest.split("+", 1)
        if "-" in rest:
            rest, pre_text = rest.split("-", 1)
        patch = _uint(rest, "patch")
        pre = tuple(_prerelease(p) for p in pre_text.split(".")) if pre_text is not None else ()
        build: tuple[str, ...] = ()
        if build_text is not None:
            for item in build_text.split("."):
                if not item:
                    raise SemverError("Build meta data is empty")
                if not _only(item, _ALNUM):
                    raise SemverError(f"Invalid character(s) found in build meta data {item!r}")
            build = tuple(build_text.split("."))
        return cls(major, minor, patch, pre, build)

    @classmethod
    def parse_normalized(cls, text: str) -> Semver:
        """The Kubernetes CEL library's ``semver(s, true)``: tolerate ``v``, ``1.2``, ``01``."""
        parts = text.removeprefix("v").split(".", 2)
        for i, part in enumerate(parts):
            if len(part) > 1:
                part = part.lstrip("0")
                if not part or part[0] not in _DIGITS:
                    part = "0" + part
                parts[i] = part
        if len(parts) < 3:
            if any(c in parts[-1] for c in "+-"):
                raise SemverError("short version cannot contain PreRelease/Build meta data")
            parts += ["0"] * (3 - len(parts))
        return cls.parse(".".join(parts))

    def compare(self, other: Semver) -> int:
        """blang's ``Version.Compare`` (build metadata does not count)."""
        for a, b in (
            (self.major, other.major),
            (self.minor, other.minor),
            (self.patch, other.patch),
        ):
            if a != b:
                return 1 if a > b else -1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for a_pre, b_pre in zip(self.pre, other.pre, strict=False):
            result = _compare_pre(a_pre, b_pre)
            if result:
                return result
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def pre_text(self) -> str:
        return ".".join(str(p) for p in self.pre)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + self.pre_text()
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def _compare_pre(a: int | str, b: int | str) -> int:
    if isinstance(a, int) and isinstance(b, int):
        return (a > b) - (a < b)
    if isinstance(a, int):
        return -1
    if isinstance(b, int):
        return 1
    return (a > b) - (a < b)
