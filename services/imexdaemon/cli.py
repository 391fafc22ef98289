"""``gpudra imex-daemon run|check``: what the ComputeDomain daemon container runs.

Its environment comes from the DaemonSet (NODE_NAME, POD_IP, POD_NAME, ...) and
from the daemon claim's CDI edits (COMPUTE_DOMAIN_UUID, CLIQUE_ID, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from pathlib import Path
from typing import Any

from services.core.process import config, serve


def _flags(parser: argparse.ArgumentParser) -> None:
    config.flag(parser, "imexd-dir", Path, "/imexd")
    config.flag(
        parser,
        "mode",
        str,
        "real",
        "real: NVIDIA's nvidia-imex; simulated: a stand-in READY only when its peers answer",
        env_name="imex-mode",
        choices=("real", "simulated"),
    )
    config.flag(parser, "imex-binary", str, "nvidia-imex")
    config.flag(parser, "imex-ctl", str, "nvidia-imex-ctl")
    config.flag(parser, "server-port", int, 50000, env_name="imex-server-port")
    config.flag(parser, "cmd-port", int, 50005, env_name="imex-cmd-port")
    parser.add_argument("--probe-interval", type=float, default=1.0)
    config.flag(
        parser,
        "hosts-file",
        Path,
        "/etc/hosts",
        "where the peers' DNS names get their addresses (IMEXDaemonsWithDNSNames): the "
        "pod's own /etc/hosts, which nvidia-imex resolves through",
        env_name="imex-hosts-file",
    )


def _run_flags(parser: argparse.ArgumentParser) -> None:
    # The DaemonSet gives the driver's gates as FEATURE_GATES (the reference's variable);
    # --feature-gates or GPUDRA_FEATURE_GATES win where given.
    parser.set_defaults(
        feature_gates=config.env("feature-gates") or os.environ.get("FEATURE_GATES", "")
    )
    _flags(parser)


def register(subparsers: config.Subparsers) -> None:
    parser = subparsers.add_parser("imex-daemon", help="the ComputeDomain IMEX daemon wrapper")
    sub = parser.add_subparsers(dest="imex_command", required=True)
    config.service(sub, "run", "join the domain and run IMEX until stopped", main, _run_flags)
    check = sub.add_parser("check", help="exit 0 when IMEX is READY (the pod's probes)")
    _flags(check)
    check.set_defaults(func=_check)


def _settings(args: argparse.Namespace) -> Any:
    from services.core.model import featuregates
    from services.imexdaemon.daemon import DaemonSettings

    gates = getattr(args, "feature_gates", None) or featuregates.FeatureGates()
    return DaemonSettings.from_env(
        args.imexd_dir, dict(os.environ), simulated=args.mode == "simulated",
        imex_binary=args.imex_binary, imex_ctl=args.imex_ctl, server_port=args.server_port,
        cmd_port=args.cmd_port, probe_s=args.probe_interval, hosts_file=args.hosts_file,
        dns_names=gates.enabled(featuregates.IMEX_DAEMONS_WITH_DNS_NAMES),
    )  # fmt: skip


def _check(args: argparse.Namespace) -> int:
    from services.imexdaemon.daemon import StartError, check

    try:
        settings = _settings(args)
    except StartError as exc:
        print(f"gpudra imex-daemon check: {exc}", file=sys.stderr)
        return 1
    if not settings.config_path.exists() and settings.clique_id:
        print(f"gpudra imex-daemon check: {settings.config_path} not written yet", file=sys.stderr)
        return 1
    ready = asyncio.run(check(settings))
    print("READY" if ready else "NOT_READY")
    return 0 if ready else 1


def main(args: argparse.Namespace) -> int:
    from services.imexdaemon.daemon import StartError

    try:
        settings = _settings(args)
        settings.check_folder()
    except StartError as exc:
        print(f"gpudra imex-daemon run: {exc}", file=sys.stderr)
        return 1
    from services.imexdaemon import app

    return serve.main("imex-daemon", args, functools.partial(app.start, settings, args))
