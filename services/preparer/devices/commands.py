"""Running the NVIDIA command-line tools (nvidia-smi, nvidia-cuda-mps-control)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from services.preparer.devices.base import DeviceOpError


def find_tool(name: str, driver_root: Path, search: tuple[str, ...] = ("usr/bin", "bin")) -> str:
    """The tool under the driver root, else on PATH; the name itself when nowhere (fails later)."""
    for sub in search:
        candidate = driver_root / sub / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name) or name


async def run(
    argv: list[str],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 30.0,
) -> str:
    """Run a tool; :class:`DeviceOpError` naming ``what`` and the tool's output on failure."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    except OSError as exc:
        raise DeviceOpError(f"{what}: cannot run {argv[0]}: {exc}") from exc
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError as exc:
        proc.kill()
        await proc.wait()
        raise DeviceOpError(f"{what}: {argv[0]} did not finish within {timeout:.0f}s") from exc
    text = out.decode(errors="replace").strip()
    if proc.returncode != 0:
        raise DeviceOpError(f"{what}: {' '.join(argv)} exited {proc.returncode}: {text}")
    return text
