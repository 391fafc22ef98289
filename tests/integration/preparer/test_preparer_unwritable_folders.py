"""Folders the preparer cannot write: the claim fails naming the folder, the service goes on.

A read-only CDI folder once answered "claim ...: internal error: [Errno 30] ...
'.k8s.gpu.nvidia.com-claim_<uid>.yaml.tmp-<pid>'" (a temp file, logged as a bug).
Now a write or removal the file system refuses (EACCES, EROFS, ENOSPC) fails that
claim with "cannot write <file> in <folder>: <errno text> (<ERRNO>)", nothing is
left half-prepared, and the next prepare, once the folder is writable, is served.

The folders are made unwritable as an attacker's node would have them: mode 0555
for an unprivileged run, a read-only bind mount (EROFS) where the test runs as
root (root ignores modes); a run that can do neither skips.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.preparer import Dev, Node, make_claim, ref

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[str]:
    """``folder`` made unwritable for the preparer; the errno text a write gets there."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield os.strerror(13)  # EACCES
        finally:
            folder.chmod(0o755)
        return
    mount = ["mount", "--bind", str(folder), str(folder)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("root without mount: cannot make a folder read-only for root")
    try:
        remount = ["mount", "-o", "remount,ro,bind", str(folder)]
        subprocess.run(remount, check=True, capture_output=True)
        yield os.strerror(30)  # EROFS
    finally:
        subprocess.run(["umount", str(folder)], check=True, capture_output=True)


async def test_a_read_only_cdi_folder_is_named_in_the_claims_error(node: Node) -> None:
    await node.start_preparer()
    cdi_root = node.root / "cdi"
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")], name="ro"))
    uid = ref(claim).uid

    with unwritable(cdi_root) as why:
        error = (await node.prepare(claim)).claims[uid].error

    assert str(cdi_root) in error and why in error, error
    assert "internal error" not in error
    assert uid not in node.checkpoint().claims  # rolled back: nothing half-prepared
    reply = await node.prepare(claim)  # the folder writable again: served as usual
    assert reply.claims[uid].error == ""


async def test_a_read_only_checkpoint_folder_is_named_in_the_claims_error(node: Node) -> None:
    await node.start_preparer()
    folder = node.checkpoint_path.parent
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-0")], name="ro"))
    uid = ref(claim).uid

    with unwritable(folder) as why:
        error = (await node.prepare(claim)).claims[uid].error

    assert str(folder) in error and why in error, error
    assert "internal error" not in error
    assert node.cdi_files() == []  # nothing the checkpoint does not vouch for
    reply = await node.prepare(claim)
    assert reply.claims[uid].error == ""
    assert list(node.checkpoint().claims) == [uid]
