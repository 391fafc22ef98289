"""``gpudra preparer``: prepare and unprepare this node's claims for the kubelet plugin."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from services.core.process import config, serve
from services.preparer import cdi, faults
from services.preparer.cdigen import hooks
from services.preparer.checkpointstore import BOOT_ID_FILE, DEFAULT_RECOVERY, RECOVERY_MODES


def register(subparsers: config.Subparsers) -> None:
    config.service(
        subparsers,
        "preparer",
        "prepare/unprepare claims on this node (configs, sharing, MIG, VFIO, CDI, checkpoint)",
        main,
        _flags,
    )


def _flags(parser: argparse.ArgumentParser) -> None:
    config.add_node_name_flag(parser)
    config.add_kubelet_root_flag(
        parser, "kubelet root; the checkpoint lives in plugins/gpu.nvidia.com/ under it"
    )
    config.flag(
        parser,
        "cdi-root",
        Path,
        cdi.DEFAULT_ROOT,
        "where claim CDI specs are written (the runtime must read this directory)",
    )
    backend = parser.add_mutually_exclusive_group()
    config.flag(
        backend,
        "fleet",
        str,
        "",
        "simulated GPUs: MIG changes go to the simulated NVML that discovery runs",
    )
    backend.add_argument(
        "--nvml", action="store_true", help="real GPUs: nvidia-smi, NVML, sysfs (the default)"
    )
    config.flag(
        parser,
        "driver-root",
        Path,
        "/",
        "where the NVIDIA driver's root is mounted, as this process sees it (the chart "
        "mounts the host's nvidiaDriverRoot at /driver-root); with --fleet, '/' means a "
        "simulated installation under the plugin directory",
    )
    config.flag(
        parser,
        "host-driver-root",
        str,
        "",
        "the same driver root as the host (the container runtime) sees it, e.g. / or "
        "/run/nvidia/driver: every host path in a CDI spec is rewritten from --driver-root "
        "to it (default: --driver-root)",
    )
    config.flag(
        parser,
        "dev-root",
        str,
        "",
        "where the host's /dev is, as this process sees it (default: --driver-root "
        "when it has a dev folder, else /)",
    )
    config.flag(
        parser,
        "nvidia-cdi-hook-path",
        str,
        "",
        "the NVIDIA Container Toolkit's nvidia-cdi-hook on the host, which CDI specs "
        f"call (default: {hooks.DEFAULT_PATH} under --host-driver-root)",
    )
    config.add_kubeconfig_flag(
        parser,
        "the API server every claim and its pod are checked against before a prepare "
        "(empty: in-cluster if there; with neither, prepares are refused)",
    )
    config.add_compute_domains_flag(
        parser,
        "also prepare compute-domain.nvidia.com claims (node label, readiness, IMEX "
        "channels, daemon edits); needs the API server for ComputeDomains and this node",
    )
    config.add_api_feature_flag(
        parser,
        "claim-device-status",
        "write each prepared GPU claim's status.devices (a Ready condition, the GPU or MIG "
        "device UUID, PCI bus id, sharing) through the API server: auto on Kubernetes 1.36+, "
        "where it may write only claims allocated to this node",
    )
    config.switch(
        parser,
        "trust-claims-bucket",
        "no API server: take claims from the claims bucket, checked only for this node "
        "(no pod check); only where every writer of the bus is trusted, e.g. a simulated node",
    )
    config.flag(
        parser,
        "boot-id-file",
        Path,
        BOOT_ID_FILE,
        "the kernel's boot id (a checkpoint from another boot is void)",
    )
    config.flag(
        parser,
        "checkpoint-recovery",
        str,
        DEFAULT_RECOVERY,
        "a checkpoint that cannot be trusted (corrupt, truncated, from a newer version): "
        "'quarantine' (default) renames it to checkpoint.json.bad-<UTC time>, logs an error "
        "and rebuilds the prepared claims from their CDI specs on the node; 'refuse' exits. "
        "The reference driver's checkpoint at the same path is adopted: its claims stay "
        "prepared (the original is kept as checkpoint.json.reference-<UTC time>). "
        "See docs/operations.md",
        choices=RECOVERY_MODES,
    )


def main(args: argparse.Namespace) -> int:
    from services.preparer.app import Settings, start

    try:
        crash = faults.Faults.from_env()
    except ValueError as exc:
        raise SystemExit(f"gpudra preparer: {exc}") from exc
    settings = config.settings(
        Settings,
        args,
        node=args.node_name,
        gates=args.feature_gates,
        simulated=bool(args.fleet),
        hook_path=args.nvidia_cdi_hook_path,
        faults=crash,
        shares=config.consumable_shares(args, "preparer"),
    )
    return serve.main("preparer", args, functools.partial(start, settings))
