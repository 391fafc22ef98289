"""The offline tools, no cluster and no bus: ``gpudra slices``, ``allocate`` and ``explain``."""

from __future__ import annotations

import argparse

from services.offline import allocate, slices


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    slices.register(subparsers)
    allocate.register(subparsers)
