"""``gpudra preparer``: prepare and unprepare this node's claims for the kubelet plugin."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from services.core.process import config, serve
from services.preparer import cdi, faults
from services.preparer.cdigen import hooks
from services.preparer.checkpointstore import BOOT_ID_FILE, DEFAULT_RECOVERY, RECOVERY_MODES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "preparer",
        help="prepare/unprepare claims on this node (configs, sharing, MIG, VFIO, CDI, checkpoint)",
    )
    config.add_common_flags(parser, node=True)
    config.add_kubelet_root_flag(
        parser, "kubelet root; the checkpoint lives in plugins/gpu.nvidia.com/ under it"
    )
    parser.add_argument(
        "--cdi-root",
        type=Path,
        default=Path(config.env("cdi-root", str(cdi.DEFAULT_ROOT))),
        help="where claim CDI specs are written (the runtime must read this directory)",
    )
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument(
        "--fleet",
        default=config.env("fleet", ""),
        help="simulated GPUs: MIG changes go to the simulated NVML that discovery runs",
    )
    backend.add_argument(
        "--nvml", action="store_true", help="real GPUs: nvidia-smi, NVML, sysfs (the default)"
    )
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=Path(config.env("driver-root", "/")),
        help="where the NVIDIA driver's root is mounted, as this process sees it (the chart "
        "mounts the host's nvidiaDriverRoot at /driver-root); with --fleet, '/' means a "
        "simulated installation under the plugin directory",
    )
    parser.add_argument(
        "--host-driver-root",
        default=config.env("host-driver-root", ""),
        help="the same driver root as the host (the container runtime) sees it, e.g. / or "
        "/run/nvidia/driver: every host path in a CDI spec is rewritten from --driver-root "
        "to it (default: --driver-root)",
    )
    parser.add_argument(
        "--dev-root",
        default=config.env("dev-root", ""),
        help="where the host's /dev is, as this process sees it (default: --driver-root "
        "when it has a dev folder, else /)",
    )
    parser.add_argument(
        "--nvidia-cdi-hook-path",
        default=config.env("nvidia-cdi-hook-path", ""),
        help="the NVIDIA Container Toolkit's nvidia-cdi-hook on the host, which CDI specs "
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
    parser.add_argument(
        "--trust-claims-bucket",
        action="store_true",
        default=config.env("trust-claims-bucket", "") == "true",
        help="no API server: take claims from the claims bucket, checked only for this node "
        "(no pod check); only where every writer of the bus is trusted, e.g. a simulated node",
    )
    parser.add_argument(
        "--boot-id-file",
        type=Path,
        default=Path(config.env("boot-id-file", str(BOOT_ID_FILE))),
        help="the kernel's boot id (a checkpoint from another boot is void)",
    )
    parser.add_argument(
        "--checkpoint-recovery",
        choices=RECOVERY_MODES,
        default=config.env("checkpoint-recovery", DEFAULT_RECOVERY),
        help="a checkpoint that cannot be trusted (corrupt, truncated, from a newer version): "
        "'quarantine' (default) renames it to checkpoint.json.bad-<UTC time>, logs an error "
        "and rebuilds the prepared claims from their CDI specs on the node; 'refuse' exits. "
        "The reference driver's checkpoint at the same path is adopted: its claims stay "
        "prepared (the original is kept as checkpoint.json.reference-<UTC time>). "
        "See docs/operations.md",
    )
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from services.preparer.app import Settings, start

    try:
        crash = faults.Faults.from_env()
    except ValueError as exc:
        raise SystemExit(f"gpudra preparer: {exc}") from exc
    settings = Settings(
        node=args.node_name,
        nats_url=args.nats_url,
        gates=args.feature_gates,
        kubelet_root=args.kubelet_root,
        cdi_root=args.cdi_root,
        simulated=bool(args.fleet),
        driver_root=args.driver_root,
        host_driver_root=args.host_driver_root,
        dev_root=args.dev_root,
        hook_path=args.nvidia_cdi_hook_path,
        kubeconfig=args.kubeconfig,
        trust_claims_bucket=args.trust_claims_bucket,
        boot_id_file=args.boot_id_file,
        faults=crash,
        checkpoint_recovery=args.checkpoint_recovery,
        compute_domains=args.compute_domains,
        claim_device_status=args.claim_device_status,
        shares=config.consumable_shares(args, "preparer"),
    )
    return serve.main("preparer", args, functools.partial(start, settings))
