"""The ``nvidia-cdi-hook`` calls in a spec (the toolkit's cdiHookCreator).

The hook binary lives on the host, so its path is the host's
(``--nvidia-cdi-hook-path``); ``argv[0]`` is its base name, and the
sub-command follows, as the toolkit writes them.
"""

from __future__ import annotations

import os
from typing import Any

from services.preparer.cdigen.model import Hook

DEFAULT_PATH = "/usr/bin/nvidia-cdi-hook"
CREATE_SYMLINKS = "create-symlinks"
ENABLE_CUDA_COMPAT = "enable-cuda-compat"
UPDATE_LDCACHE = "update-ldcache"
DISABLE_DEVICE_NODE_MODIFICATION = "disable-device-node-modification"
LIFECYCLE = "createContainer"
ENV = ("NVIDIA_CTK_DEBUG=false",)


def create_symlinks(links: list[str]) -> list[Hook]:
    """One hook for ``target::link`` pairs; none when there is nothing to link."""
    return [Hook(CREATE_SYMLINKS, tuple(links))] if links else []


def render(hook: Hook, hook_path: str) -> dict[str, Any]:
    base = os.path.basename(hook_path)
    fixed = [base, "hook"] if base == "nvidia-ctk" else [base]
    return {
        "hookName": LIFECYCLE,
        "path": hook_path,
        "args": [*fixed, hook.name, *_args(hook)],
        "env": list(ENV),
    }


def _args(hook: Hook) -> list[str]:
    if hook.name == CREATE_SYMLINKS:
        return [a for link in hook.args for a in ("--link", link)]
    if hook.name == UPDATE_LDCACHE:
        return [a for folder in hook.args for a in ("--folder", folder)]
    return list(hook.args)
