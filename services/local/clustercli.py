"""The command line of :mod:`services.local.cluster`: ``python -m services.local.clustercli``.

``up`` keeps a control plane up until Ctrl-C or until one of its processes
exits; ``build`` prints the control-plane binary's path.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from services.local import cluster
from services.local.kubebinary import build_controlplane


def _parse_gates(text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"feature gate {item!r}: want NAME=true|false")
        gates[name] = value.lower() == "true"
    return gates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.local.clustercli", description=cluster.__doc__
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a control plane and keep it up until Ctrl-C")
    up.add_argument("--nodes", default="node-1", help="comma-separated Node names")
    up.add_argument("--feature-gates", type=_parse_gates, default={}, help="NAME=bool,...")
    up.add_argument("--workdir", type=Path, help="working directory (default: a temp dir)")
    up.add_argument("--kube-version", help="1.34, 1.35, 1.36 or 1.37 (default)")
    up.add_argument(
        "--kubelet-dra",
        action="store_true",
        help="also run kubelet-dra for every node (root <workdir>/kubelet/<node>)",
    )
    build = sub.add_parser("build", help="build (or find) the binary and print its path")
    build.add_argument("--kube-version", help="1.34, 1.35, 1.36 or 1.37 (default)")
    args = parser.parse_args(argv)

    if args.cmd == "build":
        print(build_controlplane(version=args.kube_version))
        return 0

    nodes = [n for n in (s.strip() for s in args.nodes.split(",")) if n]
    cp = cluster.ControlPlane(
        build_controlplane(version=args.kube_version),
        workdir=args.workdir,
        nodes=nodes,
        feature_gates=args.feature_gates,
    )
    stop = False
    failed = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cp.start()
        if args.kubelet_dra:
            for node in nodes:
                handle = cp.start_kubelet_dra(node)
                print(f"kubelet-dra {node}: {handle.plugins_registry}", file=sys.stderr)
        print(f"logs: {cp.logs_dir}", file=sys.stderr)
        print(f"export KUBECONFIG={cp.kubeconfig}", file=sys.stderr)
        print(cp.kubeconfig, flush=True)
        while not stop:
            for p in [*cp.processes, *cp.kubelets.values()]:
                if not p.running():
                    print(
                        f"{p.name} exited with {p.proc.returncode}; see {p.log_path}",
                        file=sys.stderr,
                    )
                    stop = failed = True
            time.sleep(0.5)
    except BaseException:
        failed = True
        raise
    finally:
        if failed or args.workdir is not None:
            cp.stop()
            print(f"logs kept in {cp.logs_dir}", file=sys.stderr)
        else:
            cp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
