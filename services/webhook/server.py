"""The HTTPS front: ``POST /validate-resource-claim-parameters`` and ``GET /readyz``.

The path is the reference driver's, so its ValidatingWebhookConfiguration
works unchanged. Answers, as the reference: a body that is not JSON gets 415,
a review that cannot be read 400, a judged review 200 with the verdict. Any
failure while judging is a denial that says so, never an admission: the
webhook never admits what prepare would refuse, and never dies of a request.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from services.core.model import featuregates as fg
from services.core.process.serve import Stack
from services.webhook import admit, certs, review
from services.webhook.domains import DomainCheck
from services.webhook.metrics import REVIEWS

log = logging.getLogger(__name__)

PATH = "/validate-resource-claim-parameters"
#: The API server sends at most its request limit (3 MiB) plus the review around it.
MAX_BODY = 4 * 2**20


@dataclass
class Webhook:
    gates: fg.FeatureGates
    cert_file: Path
    key_file: Path
    reload_interval: float = 30.0
    ctx: ssl.SSLContext | None = None
    served: certs.Served | None = None
    problem: str = ""  # why /readyz fails: the certificate being served has expired
    domains: DomainCheck | None = None  # --compute-domains: a claim's ComputeDomain must exist

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(PATH, self.validate)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def validate(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return self._refuse(
                415, f"content type {request.content_type or '<none>'}; expected application/json"
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, f"request body over {MAX_BODY} bytes")
        try:
            req = review.parse(body)
        except review.TooDeep as exc:  # denied by its uid: the user reads the reason
            return self._answer(exc.request, admit.too_deep(exc.request, exc.body))
        except review.ReviewError as exc:
            return self._refuse(400, str(exc))
        try:
            verdict = admit.admit(req, self.gates)
            if verdict.allowed and self.domains is not None:
                verdict = await self.domains.judge(req)
        except Exception as exc:  # a bug (or an unanswered lookup) must deny, never admit
            log.exception("judging failed", extra={"uid": req.uid})
            verdict = admit.Verdict(
                False, f"gpudra webhook could not judge the request: {exc}", 500
            )
        return self._answer(req, verdict)

    def _answer(self, req: review.AdmissionRequest, verdict: admit.Verdict) -> web.Response:
        self._count("allowed" if verdict.allowed else "denied")
        if not verdict.allowed:
            log.info(
                "denied",
                extra={"uid": req.uid, "kind": req.kind.kind, "reason": verdict.message},
            )
        return web.Response(
            body=review.response(req.uid, verdict.allowed, verdict.message, verdict.code),
            content_type="application/json",
        )

    async def readyz(self, _: web.Request) -> web.Response:
        if self.problem:
            return web.Response(status=503, text=self.problem + "\n")
        return web.Response(text="ok\n")

    def _refuse(self, status: int, message: str) -> web.Response:
        self._count(f"http_{status}")
        log.warning("bad request", extra={"status": status, "reason": message})
        return web.Response(status=status, text=message + "\n")

    def _count(self, outcome: str) -> None:
        REVIEWS.labels(outcome).inc()

    async def watch_certificate(self) -> None:
        """Reload a renewed certificate; report (on /readyz and in the log) an expired one."""
        while True:
            await asyncio.sleep(self.reload_interval)
            self.refresh()

    def refresh(self, now: dt.datetime | None = None) -> None:
        assert self.ctx is not None and self.served is not None
        try:
            self.served = certs.reload(self.ctx, self.cert_file, self.key_file, self.served)
        except (certs.CertificateError, OSError, ssl.SSLError) as exc:
            log.error(
                "renewed certificate not loaded; still serving the old one",
                extra={"error": str(exc)},
            )
        now = now or dt.datetime.now(dt.UTC)
        if now >= self.served.not_after:
            self.problem = (
                f"serving certificate {self.cert_file} expired at "
                f"{self.served.not_after.isoformat()}; the API server refuses this webhook "
                "until it is renewed"
            )
            log.error("serving certificate expired", extra={"error": self.problem})
        else:
            self.problem = ""


async def listen(hook: Webhook, address: str, port: int, stack: Stack) -> None:
    """Serve HTTPS on ``address:port`` until the stack closes; raises
    :class:`certs.CertificateError` before listening."""
    hook.ctx, hook.served = certs.context(hook.cert_file, hook.key_file)
    runner = web.AppRunner(hook.app(), access_log=None)
    await runner.setup()
    stack.closing(runner.cleanup, "the HTTPS server")
    site = web.TCPSite(runner, address, port, ssl_context=hook.ctx)
    await site.start()
    stack.spawn("certificate watch", hook.watch_certificate, fatal=False)
    log.info(
        "serving admission reviews",
        extra={"address": f"https://{address}:{port}{PATH}", "gates": hook.gates.spec()},
    )
