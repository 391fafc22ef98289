"""`gpudra up`'s admission webhook: its certificates and its ValidatingWebhookConfiguration.

The webhook runs as a process on 127.0.0.1; the real kube-apiserver calls it by
URL (``clientConfig.url``) and trusts it through ``caBundle``, a CA made here for
it alone. The same webhook entry (name, rules, path, failure policy) is what the
chart installs with a Service instead of a URL.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NAME = "gpudra-webhook"
WEBHOOK = "gpu.nvidia.com"  # the reference's webhook name
PATH = "/validate-resource-claim-parameters"
RESOURCES = ["resourceclaims", "resourceclaimtemplates"]
VERSIONS = ["v1", "v1beta2", "v1beta1"]


_CA_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue(
    directory: Path,
    *,
    host: str = "127.0.0.1",
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Certs:
    """A CA and a serving certificate for ``host`` (an IP address), PEM files in ``directory``.

    ``not_before``/``not_after`` set the serving certificate's validity (tests
    make expired ones); the default is now-1h .. now+1y.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpudra-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(hours=1))
        .not_valid_after(not_after or now + dt.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certs = Certs(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(_pem_key(key))
    certs.key.chmod(0o600)
    return certs


def configuration(url: str, ca_bundle: bytes, failure_policy: str = "Fail") -> dict[str, Any]:
    """The ValidatingWebhookConfiguration calling ``url`` (``https://127.0.0.1:P/...``)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NAME},
        "webhooks": [
            {
                "name": WEBHOOK,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure_policy,
                "timeoutSeconds": 10,
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": VERSIONS,
                        "operations": ["CREATE", "UPDATE"],
                        "resources": RESOURCES,
                        "scope": "Namespaced",
                    }
                ],
            }
        ],
    }
