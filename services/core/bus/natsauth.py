"""Credentials for the bus: nkey identities, a local CA, and the server's auth config.

``gpudra up``, ``gpudra nats`` and the tests keep everything in one access
directory (0700)::

    ca.pem, ca.key                 the CA the clients trust (made here, EC P-256)
    server.pem, server.key         nats-server's certificate (127.0.0.1, localhost), valid
                                   for server and client auth: in a cluster each server
                                   presents it on the routes it accepts and dials
    users/<identity>.nk            one nkey seed per component instance (0600)

:func:`authorization` turns the users found there into the nats-server
``authorization`` block with each identity's :mod:`services.core.bus.access`
permissions. In a cluster the chart makes the same from its own secrets.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from services.core.bus.access import Identity, Role

CERT_DAYS = 365
#: The largest message anyone may publish (nats-server refuses more): a prepare of
#: 512 claims with the longest names the API allows is 190 KB, a DGX A100's
#: inventory with its MIG layout 18 KB.
MAX_PAYLOAD = 1024 * 1024


class CredentialsError(RuntimeError):
    """A credentials file that is missing, unreadable or not what it should be."""


@dataclass(frozen=True)
class Credentials:
    """What a client needs to connect: its identity (an nkey seed file, or in a cluster
    a projected ServiceAccount token file the auth callout checks) and the CA to trust."""

    creds: Path | None = None
    ca: Path | None = None
    token_file: Path | None = None

    def argv(self) -> list[str]:
        """The flags that hand these credentials to a gpudra process."""
        out: list[str] = []
        if self.creds is not None:
            out += ["--nats-creds", str(self.creds)]
        if self.token_file is not None:
            out += ["--nats-token-file", str(self.token_file)]
        if self.ca is not None:
            out += ["--nats-ca", str(self.ca)]
        return out

    def token(self) -> str:
        """The token file's content, read now: the kubelet rotates a projected token,
        so the client calls this on every (re)connect, never caching it."""
        if self.token_file is None:
            raise CredentialsError("no --nats-token-file given")
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise CredentialsError(f"--nats-token-file {self.token_file}: {exc.strerror}") from exc
        if not token:
            raise CredentialsError(f"--nats-token-file {self.token_file}: empty")
        return token

    def seed(self) -> str:
        if self.creds is None:
            raise CredentialsError("no --nats-creds given")
        try:
            seed = self.creds.read_text().strip()
            nkeys.from_seed(bytearray(seed.encode()))
        except OSError as exc:
            raise CredentialsError(f"--nats-creds {self.creds}: {exc.strerror}") from exc
        except Exception as exc:  # nkeys raises its own error types and binascii's
            raise CredentialsError(f"--nats-creds {self.creds}: not an nkey seed") from exc
        return seed

    def tls(self) -> ssl.SSLContext | None:
        if self.ca is None:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.ca))
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"--nats-ca {self.ca}: {exc}") from exc


def new_seed() -> str:
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)).decode()


def public_key(seed: str) -> str:
    return bytes(nkeys.from_seed(bytearray(seed.encode())).public_key).decode()


class AccessDir:
    """The access directory: a CA, the server's certificate and the users' seeds."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.users = root / "users"

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "server.key"

    def ensure(self, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> AccessDir:
        """Make the directory, the CA and the server certificate when missing."""
        self.users.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.users):
            d.chmod(0o700)
        if not self.server_cert.exists():
            _make_tls(self.root, hosts)
        return self

    def user(self, identity: Identity) -> Path:
        """The seed file of ``identity``, made on first use."""
        path = self.users / f"{identity.name}.nk"
        if not path.exists():
            _write_private(path, new_seed() + "\n")
        return path

    def credentials(self, identity: Identity) -> Credentials:
        return Credentials(creds=self.user(identity), ca=self.ca)

    def identities(self) -> dict[Identity, str]:
        """Every user with a seed here, and its public key."""
        found: dict[Identity, str] = {}
        for path in sorted(self.users.glob("*.nk")):
            found[identity_of(path.name[: -len(".nk")])] = public_key(path.read_text().strip())
        return found

    def server_config(
        self, *, listen: str, store_dir: Path, name: str, cluster: Route | None = None
    ) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "listen": listen,
            "server_name": name,
            "max_payload": MAX_PAYLOAD,
            "jetstream": {"store_dir": str(store_dir)},
            "tls": {
                "cert_file": str(self.server_cert),
                "key_file": str(self.server_key),
                "timeout": 5,
            },
            "authorization": authorization(self.identities()),
        }
        if cluster is not None:
            conf["cluster"] = {
                "name": cluster.name,
                "listen": cluster.listen,
                "routes": list(cluster.routes),
                # Mutual TLS: a peer is a server holding a certificate from our CA.
                "tls": {
                    "cert_file": str(self.server_cert),
                    "key_file": str(self.server_key),
                    "ca_file": str(self.ca),
                    "verify": True,
                    "timeout": 5,
                },
            }
        return conf


@dataclass(frozen=True)
class Route:
    """One server's place in a cluster: the cluster's name, its route listener, its peers."""

    name: str
    listen: str  # host:port
    routes: tuple[str, ...]  # nats-route://host:port of the other servers


def identity_of(name: str) -> Identity:
    """Inverse of :attr:`Identity.name`."""
    from services.core.bus.subjects import unescape_token

    role, _, node = name.partition(".")
    return Identity(Role(role), unescape_token(node) if node else "")


def authorization(users: dict[Identity, str]) -> dict[str, Any]:
    """nats-server's ``authorization`` block: each nkey with its identity's permissions."""
    entries = []
    for identity, key in users.items():
        perms = identity.permissions()
        entries.append(
            {
                "nkey": key,
                "permissions": {
                    "publish": {"allow": list(perms.publish), "deny": list(perms.publish_deny)},
                    "subscribe": {"allow": list(perms.subscribe)},
                },
            }
        )
    return {"users": entries}


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _make_tls(root: Path, hosts: tuple[str, ...]) -> None:
    """A CA and a server certificate for ``hosts`` (IP addresses or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> str:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("gpudra bus CA"))
        .issuer_name(name("gpudra bus CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("gpudra nats-server"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            # clientAuth too: a cluster's servers present it when they dial each other's routes
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    _write_private(root / "ca.key", pem_key(ca_key))
    _write_private(root / "server.key", pem_key(key))
    (root / "ca.pem").write_bytes(ca.public_bytes(pem))
    (root / "server.pem").write_bytes(cert.public_bytes(pem))
