"""Debian's Prometheus for the alert tests: unpacked by services/local/prometheus/build.sh
(``make prometheus``; a warm call hashes two files) or named by ``GPUDRA_PROMETHEUS``.

Where it cannot be had (no apt-get, or apt knows no prometheus package) the tests that
need it skip, saying how to get it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from services.local.prometheus import HOW, PrometheusError, build_prometheus, promtool

__all__ = ["prometheus_binary", "promtool_binary"]


@functools.cache
def _binary() -> Path | str:
    try:
        return build_prometheus()
    except PrometheusError as e:
        return f"no Prometheus: {HOW}. {e}"


def prometheus_binary() -> Path:
    binary = _binary()
    if isinstance(binary, str):
        pytest.skip(binary)
    return binary


def promtool_binary() -> Path:
    return promtool(prometheus_binary())
