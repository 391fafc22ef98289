"""The offline tools, no cluster and no bus: ``gpudra slices``, ``allocate``, ``explain``
and ``host-check`` (a GPU node's own NVML, read only)."""

from __future__ import annotations

import argparse

from services.offline import allocate, hostcheck, slices


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    slices.register(subparsers)
    allocate.register(subparsers)
    hostcheck.register(subparsers)
