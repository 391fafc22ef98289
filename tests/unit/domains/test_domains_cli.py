"""``gpudra domains`` flags that describe the IMEX daemons' bus credentials."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.cli import build_parser
from services.domains.cli import daemon_bus

REPO = Path(__file__).resolve().parents[3]


def test_no_ca_secret_renders_no_credentials_and_the_url_defaults_to_the_controllers() -> None:
    parser = build_parser()
    assert daemon_bus(parser.parse_args(["domains"])) is None
    args = parser.parse_args(["domains", "--nats-url", "tls://bus:4222",
                              "--daemon-nats-ca-secret", "g-nats-tls"])  # fmt: skip
    bus = daemon_bus(args)
    assert bus is not None and (bus.url, bus.ca_secret) == ("tls://bus:4222", "g-nats-tls")
    assert (bus.audience, bus.token_seconds) == ("gpudra-nats", 3600)


def test_a_token_lifetime_the_api_server_would_refuse_stops_the_controller_at_start() -> None:
    """A projected token lives at least 600 s: a shorter one would fail every daemon pod."""
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "domains", "--daemon-nats-ca-secret", "s",
         "--daemon-nats-token-seconds", "300"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--daemon-nats-token-seconds must be at least 600" in done.stderr
