"""The bus in a cluster: one identity per component instance, from Kubernetes tokens.

A real kube-apiserver issues the ServiceAccount tokens (pod-bound ones carry the
pod's node) and answers the TokenReviews; a real nats-server runs the chart's own
accounts and auth callout block (files/nats-auth.conf); a real ``gpudra nats-auth``
process, logged in with its own ServiceAccount's token (RBAC: create tokenreviews,
nothing else), answers the server. Each test tries to cross one trust boundary.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from nats.aio.client import Client as NatsClient

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.bus.natsauth import public_key
from services.core.kit import supervisor
from services.core.model import computedomain as cd
from services.domains.objects import DaemonBus, DaemonSettings, daemon_set
from services.local.cluster import ControlPlane
from tests.helpers.imex import a_domain
from tests.helpers.natsauth import REPO, AuthService, CalloutNats

pytestmark = pytest.mark.e2e

NS = "gpudra-auth-e2e"
N1, N2 = "e2e-node-1", "e2e-node-2"  # the session's Nodes
AUD = "gpudra-nats"
DENIED = "permissions violation"
PROVISION = "gpudra-provision-"  # the chart's Job of each release revision: <release>-provision-<n>
GRANTS = [
    f"discovery={NS}/gpudra-node",
    f"preparer={NS}/gpudra-node",
    f"kubeletplugin={NS}/gpudra-node",
    f"allocator={NS}/gpudra-allocator",
    f"publisher={NS}/gpudra-publisher",
    f"admin={NS}/gpudra-provision",
    f"imex-daemon={NS}/{cd.DAEMON_SERVICE_ACCOUNT}",
]
ACCOUNTS = ["gpudra-node", "gpudra-allocator", "gpudra-publisher", "gpudra-provision",
            "gpudra-nats-auth", "intruder", cd.DAEMON_SERVICE_ACCOUNT]  # fmt: skip


@dataclass
class Bed:
    cp: ControlPlane
    root: Path
    nats: CalloutNats
    auth: AuthService
    seeds: dict[str, str]

    def token(self, account: str, role: str, pod: str = "", name: str = "") -> Path:
        """A token file for ``account`` with audience gpudra-nats:<role> (bound to ``pod``)."""
        args = ["create", "token", account, "-n", NS, "--audience", f"{AUD}:{role}",
                "--duration", "1h"]  # fmt: skip
        if pod:
            args += ["--bound-object-kind", "Pod", "--bound-object-name", pod]
        path = self.root / (name or f"{account}-{role}-{pod or 'unbound'}.token")
        path.write_text(self.cp.kubectl(*args).strip())
        return path

    def read(self, path: Path) -> str:
        return path.read_text()

    def token_text(self, account: str, role: str, pod: str = "") -> str:
        return self.token(account, role, pod).read_text()

    def provision_job(self, revision: int, node: str = N1) -> str:
        """The chart's provision Job of one release revision and its pod, as the Job
        controller makes them (none runs here: the pod stays Pending); the pod's name."""
        job = f"{PROVISION}{revision}"
        spec = {"serviceAccountName": "gpudra-provision", "restartPolicy": "OnFailure",
                "automountServiceAccountToken": False,
                "containers": [{"name": "provision", "image": "gpudra:e2e"}]}  # fmt: skip
        self.cp.apply({"apiVersion": "batch/v1", "kind": "Job",
                       "metadata": {"name": job, "namespace": NS},
                       "spec": {"template": {"spec": spec}}})  # fmt: skip
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "controller": True,
                 "uid": self.cp.get("job", job, NS)["metadata"]["uid"]}  # fmt: skip
        pod = f"{job}-x2k4p"
        self.cp.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": pod, "namespace": NS, "ownerReferences": [owner]},
                       "spec": {**spec, "nodeName": node}})  # fmt: skip
        return pod

    def pod_done(self, pod: str) -> None:
        """The pod's container exited 0: what the kubelet reports when the Job is done."""
        self.cp.kubectl("patch", "pod", pod, "-n", NS, "--subresource=status", "--type=merge",
                        "-p", '{"status":{"phase":"Succeeded"}}')  # fmt: skip

    def pod(self, name: str, node: str, account: str = "gpudra-node") -> None:
        """A pod scheduled on ``node`` (no kubelet runs it: the binding is what counts)."""
        self.cp.apply({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"serviceAccountName": account, "nodeName": node,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "gpudra:e2e"}]},
        })  # fmt: skip


def _setup_cluster(cp: ControlPlane) -> None:
    cp.kubectl("create", "namespace", NS)
    for account in ACCOUNTS:
        cp.kubectl("create", "serviceaccount", account, "-n", NS)
    cp.kubectl("create", "clusterrole", "gpudra-e2e-nats-auth", "--verb=create",
               "--resource=tokenreviews.authentication.k8s.io")  # fmt: skip
    cp.kubectl("create", "clusterrolebinding", "gpudra-e2e-nats-auth",
               "--clusterrole=gpudra-e2e-nats-auth",
               f"--serviceaccount={NS}:gpudra-nats-auth")  # fmt: skip
    # who may be admin: a running pod of the provision Job (the chart's namespaced Role)
    cp.kubectl("create", "role", "gpudra-e2e-nats-auth", "-n", NS, "--verb=get",
               "--resource=pods,jobs.batch")  # fmt: skip
    cp.kubectl("create", "rolebinding", "gpudra-e2e-nats-auth", "-n", NS, "--role",
               "gpudra-e2e-nats-auth", f"--serviceaccount={NS}:gpudra-nats-auth")  # fmt: skip


def _run_keygen(cp: ControlPlane) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "nats-keygen", "--namespace", NS,
         "--secret", "gpudra-nats-auth", "--configmap", "gpudra-nats-auth-public",
         "--kubeconfig", str(cp.kubeconfig)],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


def _keygen(cp: ControlPlane) -> dict[str, str]:
    """``gpudra nats-keygen`` as the chart's hook runs it; the seeds as the Secret holds them."""
    public = _run_keygen(cp)
    secret = cp.get("secret", "gpudra-nats-auth", NS)["data"]
    seeds = {k: base64.b64decode(v).decode() for k, v in secret.items()}
    assert cp.get("configmap", "gpudra-nats-auth-public", NS)["data"] == {
        "issuer": public["issuer"], "user": public["user"]
    }  # fmt: skip
    assert public_key(seeds["user.nk"]) == public["user"]
    return {**seeds, "issuer": public["issuer"], "user": public["user"]}


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o400)
    return path


def _auth_kubeconfig(cp: ControlPlane, root: Path) -> Path:
    """A kubeconfig carrying the auth service's own ServiceAccount token."""
    config = json.loads(cp.kubeconfig.read_text())
    token = cp.kubectl("create", "token", "gpudra-nats-auth", "-n", NS).strip()
    config["users"][0]["user"] = {"token": token}
    return _private(root / "auth.kubeconfig", json.dumps(config))


@pytest.fixture(scope="module")
def bed(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    root = tmp_path_factory.mktemp("nats-auth")
    _setup_cluster(controlplane)
    seeds = _keygen(controlplane)
    keys = root / "keys"
    keys.mkdir(mode=0o700)
    issuer_file = _private(keys / "issuer.nk", seeds["issuer.nk"])
    user_file = _private(keys / "user.nk", seeds["user.nk"])
    server = CalloutNats(root, issuer=seeds["issuer"], auth_user=seeds["user"])
    server.start()
    argv = ["--nats-url", server.url, "--nats-creds", str(user_file),
            "--nats-ca", str(server.access.ca), "--issuer-seed-file", str(issuer_file),
            "--kubeconfig", str(_auth_kubeconfig(controlplane, root)),
            f"--grants={','.join(GRANTS)}", "--admin-job-prefix", PROVISION]  # fmt: skip
    auth = AuthService(argv, root / "nats-auth.log")
    try:
        auth.start()
        yield Bed(controlplane, root, server, auth, seeds)
    finally:
        auth.stop()
        server.stop()
        controlplane.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        controlplane.kubectl("delete", "clusterrolebinding,clusterrole", "gpudra-e2e-nats-auth",
                             check=False)  # fmt: skip


class Client:
    """A raw NATS client that records the server's refusals."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: NatsClient | None = None

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc))

    async def refused(self, subject: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not any(DENIED in e and subject.lower() in e.lower() for e in self.errors):
            assert time.monotonic() < deadline, f"no refusal of {subject}: {self.errors}"
            await asyncio.sleep(0.02)


@pytest.fixture
async def connect(bed: Bed) -> AsyncIterator[object]:
    made: list[Client] = []

    async def make(token: Path, who: Identity) -> Client:
        client = Client()
        creds = bed.nats.client(token_file=token)
        client.nc = await nats.connect(
            bed.nats.url, token=creds.token, tls=creds.tls(), inbox_prefix=who.inbox_prefix,
            error_cb=client.on_error, allow_reconnect=True, max_reconnect_attempts=-1,
            reconnect_time_wait=0.2, name=who.name,
        )  # fmt: skip
        made.append(client)
        return client

    yield make
    for client in made:
        if client.nc is not None:
            await client.nc.close()


async def _refused_at_connect(bed: Bed, token: str) -> str:
    """Connect once with ``token`` and return the server's refusal."""
    with pytest.raises(nats.errors.Error) as refused:
        await nats.connect(bed.nats.url, token=token, tls=bed.nats.client().tls(),
                           allow_reconnect=False, connect_timeout=5)  # fmt: skip
    return str(refused.value)


async def test_a_node_token_gets_its_nodes_permissions_and_not_another_nodes(bed, connect):
    bed.pod("node-b", N2)
    preparer = Identity(Role.PREPARER, N2)
    client = await connect(bed.token("gpudra-node", "preparer", "node-b"), preparer)
    nc = client.nc
    await nc.subscribe(subjects.node_prepare(N2))  # its own node: allowed
    await nc.subscribe(subjects.node_prepare(N1))  # another node's requests: refused
    await nc.publish(f"$KV.{subjects.PREPARED_BUCKET}.{subjects.prepared_key(N1)}", b"{}")
    await nc.flush()
    await client.refused(subjects.node_prepare(N1))
    await client.refused(subjects.prepared_key(N1))
    assert not any(subjects.node_prepare(N2) in e for e in client.errors)
    allowed = [d for d in bed.auth.decisions() if d.get("identity") == preparer.name]
    assert allowed and allowed[-1]["client"] == preparer.name


async def test_the_same_node_account_is_the_front_only_with_the_fronts_audience(bed, connect):
    """One pod, one ServiceAccount: the role comes from the container's token audience."""
    bed.pod("node-a", N1)
    front = Identity(Role.FRONT, N1)
    client = await connect(bed.token("gpudra-node", "kubeletplugin", "node-a"), front)
    await client.nc.subscribe(subjects.node_prepare(N1))  # the front requests, never answers
    await client.nc.flush()
    await client.refused(subjects.node_prepare(N1))


async def test_a_nodes_front_and_preparer_talk_through_the_callouts_permissions(bed, connect):
    """Request and reply work end to end: the preparer's JWT lets it publish into its
    front's inbox (and nowhere else: no ``resp`` grant)."""
    bed.pod("talk", N1)
    front, preparer = Identity(Role.FRONT, N1), Identity(Role.PREPARER, N1)
    answering = await connect(bed.token("gpudra-node", "preparer", "talk"), preparer)
    asking = await connect(bed.token("gpudra-node", "kubeletplugin", "talk"), front)

    async def answer(msg):
        await msg.respond(b"prepared")

    await answering.nc.subscribe(subjects.node_prepare(N1), cb=answer)
    await answering.nc.flush()
    deadline = time.monotonic() + 30
    while True:  # a loaded run once saw no responder right after the flush: ask again
        try:
            reply = await asking.nc.request(subjects.node_prepare(N1), b"{}", timeout=10)
            break
        except nats.errors.NoRespondersError:
            assert time.monotonic() < deadline, "the preparer's subscription never took"
            await asyncio.sleep(0.2)
    assert reply.data == b"prepared"
    assert not answering.errors and not asking.errors


async def test_an_imex_daemon_pod_as_the_controller_makes_it_is_its_nodes_daemon_only(bed, connect):
    """The DaemonSet's pod template, bound to a node, with the token its projected volume
    asks for: the callout makes it imex-daemon.<that node>, which writes only its own
    member key (another node's is refused)."""
    domain = a_domain("d0e1a2b3-0000-4000-8000-0000000000e2")
    bus = DaemonBus(url=bed.nats.url, ca_secret="gpudra-nats-tls", audience=AUD)
    template = daemon_set(domain, DaemonSettings(NS, bus=bus))["spec"]["template"]
    bed.cp.apply({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "imex-daemon-n1", "namespace": NS, **template["metadata"]},
                  "spec": {**template["spec"], "nodeName": N1}})  # fmt: skip
    (volume,) = template["spec"]["volumes"]
    audience = volume["projected"]["sources"][0]["serviceAccountToken"]["audience"]
    assert audience == f"{AUD}:imex-daemon"
    daemon = Identity(Role.IMEX, N1)
    token = bed.token(cd.DAEMON_SERVICE_ACCOUNT, "imex-daemon", "imex-daemon-n1")
    client = await connect(token, daemon)
    own = f"$KV.{subjects.DOMAINS_BUCKET}.{subjects.domain_member_key(domain.uid, N1)}"
    other = f"$KV.{subjects.DOMAINS_BUCKET}.{subjects.domain_member_key(domain.uid, N2)}"
    index = f"$KV.{subjects.DOMAINS_BUCKET}.{subjects.domain_index_key(domain.uid, N1)}"
    for subject in (own, other, index):
        await client.nc.publish(subject, b"{}")
    await client.nc.flush()
    await client.refused(other)
    await client.refused(index)
    assert not any(own.lower() in e.lower() for e in client.errors)  # nats-py lowercases
    allowed = [d for d in bed.auth.decisions() if d.get("identity") == daemon.name]
    assert allowed and allowed[-1]["client"] == daemon.name


async def test_provision_as_admin_then_components_use_jetstream(bed):
    """``gpudra provision`` with the token of the provision Job's pod; then the allocator's
    claims bucket exists in the GPUDRA account and the allocator may write it."""
    token = bed.token("gpudra-provision", "admin", bed.provision_job(1))
    creds = bed.nats.client(token_file=token)
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.cli", "provision", "--nats-url", bed.nats.url,
         *creds.argv()], check=True, cwd=REPO, capture_output=True,
    )  # fmt: skip
    allocator = Identity(Role.ALLOCATOR)
    alloc = bed.nats.client(token_file=bed.token("gpudra-allocator", "allocator"))
    bus = await Bus.connect(bed.nats.url, name="allocator", identity=allocator, credentials=alloc)
    try:
        kv = await bus.kv(subjects.CLAIMS_BUCKET)
        assert await kv.put("e2e", b"{}") > 0
    finally:
        await bus.close()


async def test_admin_only_from_a_pod_of_the_provision_job_while_it_runs(bed):
    """The attack: the provisioning identity set CLAIMS to max_msgs=1 after the install,
    with a token of its ServiceAccount that anyone allowed to mint tokens for it gets
    (``kubectl create token``). Now such a token, one bound to another pod of that
    account, or one bound to the Job's pod once it has finished, is refused; while the
    Job's pod runs it is admin."""
    unbound = bed.token_text("gpudra-provision", "admin")
    assert "Authorization Violation" in await _refused_at_connect(bed, unbound)
    assert "bound to a pod of the provision Job" in bed.auth.decisions()[-1]["reason"]
    bed.pod("not-the-job", N1, "gpudra-provision")
    other = bed.token_text("gpudra-provision", "admin", "not-the-job")
    assert "Authorization Violation" in await _refused_at_connect(bed, other)
    assert f"is no pod of a Job {PROVISION}*" in bed.auth.decisions()[-1]["reason"]

    pod = bed.provision_job(2)
    token = bed.token_text("gpudra-provision", "admin", pod)
    nc = await nats.connect(bed.nats.url, token=token, tls=bed.nats.client().tls(),
                            allow_reconnect=False, connect_timeout=5)  # fmt: skip
    try:
        assert (await nc.jetstream().account_info()).limits  # admin: the JetStream API
    finally:
        await nc.close()
    assert bed.auth.decisions()[-1]["identity"] == "admin"
    bed.pod_done(pod)
    assert "Authorization Violation" in await _refused_at_connect(bed, token)
    assert "is Succeeded: its provision Job is done" in bed.auth.decisions()[-1]["reason"]


@pytest.mark.parametrize(
    "account, role, bound, why",
    [
        ("intruder", "preparer", True, "may not be preparer"),  # an unknown ServiceAccount
        ("gpudra-node", "admin", True, "may not be admin"),  # a granted account, another role
        ("gpudra-allocator", "preparer", False, "may not be preparer"),
        ("gpudra-node", "preparer", False, "bound to a pod on a node"),  # no node in the token
        (cd.DAEMON_SERVICE_ACCOUNT, "preparer", True, "may not be preparer"),
        (cd.DAEMON_SERVICE_ACCOUNT, "imex-daemon", False, "bound to a pod on a node"),
    ],
)
async def test_tokens_that_do_not_earn_the_role_are_refused(bed, account, role, bound, why):
    if bound:
        bed.pod(f"p-{account}", N2, account)
    token = bed.token_text(account, role, f"p-{account}" if bound else "")
    assert "Authorization Violation" in await _refused_at_connect(bed, token)
    assert why in bed.auth.decisions()[-1]["reason"]


async def test_a_token_for_another_audience_is_refused(bed):
    raw = bed.cp.kubectl("create", "token", "gpudra-allocator", "-n", NS,
                         "--audience", "https://kubernetes.default.svc").strip()  # fmt: skip
    assert "Authorization Violation" in await _refused_at_connect(bed, raw)
    assert "no single gpudra-nats:<role>" in bed.auth.decisions()[-1]["reason"]


async def test_garbage_and_no_token_are_refused(bed):
    for token in ("garbage", "a.b.c", ""):
        assert "Authorization Violation" in await _refused_at_connect(bed, token)


async def _refused_once_the_api_server_knows(bed: Bed, token: str, timeout: float = 30) -> None:
    """The API server caches token verdicts for 10 s: poll until the revocation shows."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            nc = await nats.connect(bed.nats.url, token=token, tls=bed.nats.client().tls(),
                                    allow_reconnect=False, connect_timeout=5)  # fmt: skip
        except nats.errors.Error as exc:
            assert "Authorization Violation" in str(exc)
            return
        await nc.close()
        assert time.monotonic() < deadline, "a deleted pod's token is still accepted"
        await asyncio.sleep(0.5)


async def test_an_expired_token_signed_by_the_cluster_is_refused(bed):
    """A token made with the API server's own signing key, expired a minute ago."""
    uid = bed.cp.get("serviceaccount", "gpudra-allocator", NS)["metadata"]["uid"]
    now = int(time.time())
    claims = {"iss": "https://kubernetes.default.svc", "aud": [f"{AUD}:allocator"],
              "sub": f"system:serviceaccount:{NS}:gpudra-allocator",
              "iat": now - 3600, "nbf": now - 3600, "exp": now - 60,
              "kubernetes.io": {"namespace": NS, "serviceaccount": {
                  "name": "gpudra-allocator", "uid": uid}}}  # fmt: skip
    token = _rs256(bed.cp.pki / "sa.key", claims)
    assert "Authorization Violation" in await _refused_at_connect(bed, token)
    assert "expired" in bed.auth.decisions()[-1]["reason"]


async def test_a_deleted_pods_token_is_refused_and_a_rotated_token_is_read_on_reconnect(
    bed, connect
):
    """The client reads its token file on every reconnect (the kubelet rotates it)."""
    bed.pod("rot-old", N2)
    bed.pod("rot-new", N2)
    token = bed.token("gpudra-node", "discovery", "rot-old", name="discovery.token")
    client = await connect(token, Identity(Role.DISCOVERY, N2))
    rotated = bed.token("gpudra-node", "discovery", "rot-new", name="rotated.token")
    bed.cp.kubectl("delete", "pod", "rot-old", "-n", NS, "--force", "--grace-period=0")
    await _refused_once_the_api_server_knows(bed, bed.read(token))  # revoked with its pod
    os.replace(rotated, token)  # what the kubelet does
    bed.nats.restart()  # every client reconnects
    deadline = time.monotonic() + 30
    while not (client.nc.is_connected and client.nc.stats["reconnects"] >= 1):
        assert time.monotonic() < deadline, "the client is not back with its rotated token"
        await asyncio.sleep(0.05)
    await client.nc.subscribe(subjects.sim_control(N2))
    await client.nc.flush()


async def test_a_token_near_its_expiry_is_swapped_for_the_rotated_one_without_a_restart(bed):
    """The server drops a connection when the token it was made with expires, and nats-py
    then closes for good (the process would restart once per token lifetime). The bus
    reconnects with the kubelet's rotated token before that, and stays up past expiry."""
    uid = bed.cp.get("serviceaccount", "gpudra-allocator", NS)["metadata"]["uid"]
    now = int(time.time())
    short = {"iss": "https://kubernetes.default.svc", "aud": [f"{AUD}:allocator"],
             "sub": f"system:serviceaccount:{NS}:gpudra-allocator",
             "iat": now, "nbf": now, "exp": now + 20,
             "kubernetes.io": {"namespace": NS, "serviceaccount": {
                 "name": "gpudra-allocator", "uid": uid}}}  # fmt: skip
    token = bed.root / "short-lived.token"
    token.write_text(_rs256(bed.cp.pki / "sa.key", short))
    creds = bed.nats.client(token_file=token)
    bus = await Bus.connect(
        bed.nats.url, name="allocator", identity=Identity(Role.ALLOCATOR), credentials=creds
    )
    try:
        os.replace(bed.token("gpudra-allocator", "allocator", name="rotated-1h.token"), token)
        deadline = time.monotonic() + 60
        while not (bus.nc.stats["reconnects"] >= 1 and bus.nc.is_connected):
            assert time.monotonic() < deadline, f"no reconnect: {bus.nc.last_error}"
            await asyncio.sleep(0.1)
        while time.time() < now + 20 + 3:  # past the first token's expiry
            await asyncio.sleep(0.2)
        assert bus.nc.is_connected and not bus.nc.is_closed, bus.nc.last_error
        assert supervisor.current().failure is None
        await bus.nc.flush(timeout=5)
        assert bus.nc.stats["reconnects"] == 1  # once: the rotated token lasts an hour
    finally:
        await bus.close()


def test_the_issuers_key_never_leaves_the_auth_service(bed):
    """Not in what the server logged, nor in anything the service answered or logged; and
    the service refuses a key file others may read."""
    seed, user_seed = bed.seeds["issuer.nk"].strip(), bed.seeds["user.nk"].strip()
    seen = bed.nats.log.read_text() + bed.auth.log.read_text()
    assert seed not in seen and user_seed not in seen
    loose = bed.root / "loose.nk"
    loose.write_text(seed)
    loose.chmod(0o644)
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "nats-auth", "--issuer-seed-file", str(loose),
         f"--grants={GRANTS[0]}"], capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "readable or writable by others" in proc.stderr
    assert seed not in proc.stderr + proc.stdout


def _rs256(key_file: Path, claims: dict[str, object]) -> str:
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    head = b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{b64(sig)}"


def test_keygen_again_keeps_the_keys_and_puts_back_the_public_ones(bed):
    """The hook runs on every upgrade: it must never change the keys under a running bus."""
    cm = ("configmap", "gpudra-nats-auth-public")
    bed.cp.kubectl("patch", *cm, "-n", NS, "--type=merge", "-p", '{"data":{"issuer":"AFORGED"}}')
    public = _run_keygen(bed.cp)
    assert (public["issuer"], public["user"]) == (bed.seeds["issuer"], bed.seeds["user"])
    assert bed.cp.get(*cm, NS)["data"] == {"issuer": public["issuer"], "user": public["user"]}
    bed.cp.kubectl("delete", *cm, "-n", NS)
    assert _run_keygen(bed.cp)["issuer"] == bed.seeds["issuer"]
    assert bed.cp.get(*cm, NS)["data"]["issuer"] == bed.seeds["issuer"]
