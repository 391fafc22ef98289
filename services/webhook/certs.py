"""The serving certificate: checked before it is served, reloaded when renewed.

cert-manager (or the chart's hook) renews the Secret in place; the kubelet
updates the mounted files; new TLS handshakes then get the new certificate
without a restart. A certificate that has expired, is not yet valid, or does
not match its key is a :class:`CertificateError` naming the file and the date,
never a TLS failure the API server reports as "connection reset".
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization


class CertificateError(ValueError):
    """A serving certificate or key that cannot be served; the message says which and why."""


@dataclass(frozen=True)
class Served:
    """What is being served, to notice a renewal or an expiry."""

    stamp: tuple[float, float]  # mtimes of (cert, key)
    not_after: dt.datetime


def check(cert_file: Path, key_file: Path, now: dt.datetime | None = None) -> dt.datetime:
    """Raise :class:`CertificateError` unless the pair can be served now; its notAfter."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        cert_pem = cert_file.read_bytes()
    except OSError as exc:
        raise CertificateError(f"serving certificate {cert_file}: {exc.strerror}") from exc
    try:
        key_pem = key_file.read_bytes()
    except OSError as exc:
        raise CertificateError(f"serving key {key_file}: {exc.strerror}") from exc
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertificateError(f"serving certificate {cert_file}: not a PEM certificate") from exc
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"serving key {key_file}: not an unencrypted PEM key") from exc
    not_before, not_after = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= not_after:
        raise CertificateError(
            f"serving certificate {cert_file} expired at {not_after.isoformat()} "
            f"(now {now.replace(microsecond=0).isoformat()}); renew it (cert-manager, or "
            "upgrade the chart to issue a new one)"
        )
    if now < not_before:
        raise CertificateError(
            f"serving certificate {cert_file} is not valid before {not_before.isoformat()}"
        )
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, public) != cert.public_key().public_bytes(der, public):
        raise CertificateError(f"serving key {key_file} does not match certificate {cert_file}")
    return not_after


def stamp(cert_file: Path, key_file: Path) -> tuple[float, float]:
    return (cert_file.stat().st_mtime, key_file.stat().st_mtime)


def context(cert_file: Path, key_file: Path) -> tuple[ssl.SSLContext, Served]:
    """A TLS 1.2+ server context for a checked pair."""
    not_after = check(cert_file, key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx, Served(stamp(cert_file, key_file), not_after)


def reload(ctx: ssl.SSLContext, cert_file: Path, key_file: Path, served: Served) -> Served:
    """Load a renewed pair into ``ctx`` (new handshakes get it); unchanged files: no-op.

    A renewed pair that cannot be served raises and leaves ``ctx`` as it was.
    """
    current = stamp(cert_file, key_file)
    if current == served.stamp:
        return served
    not_after = check(cert_file, key_file)
    ctx.load_cert_chain(cert_file, key_file)
    return Served(current, not_after)
