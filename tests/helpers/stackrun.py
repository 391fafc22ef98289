"""A stack for a test module's fixture: started, stopped, its work dir kept when it matters."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from services.local.stack import Stack


@contextmanager
def started_stack(
    request: pytest.FixtureRequest, stack: Stack, what: str = "stack"
) -> Iterator[Stack]:
    """Start ``stack`` and stop it after the fixture's tests. Its work dir (the logs) is
    kept when it did not start, when a test failed meanwhile, or with GPUDRA_E2E_KEEP=1;
    removed otherwise."""
    failed_before = request.session.testsfailed
    failed = True
    try:
        stack.start()
        yield stack
        failed = request.session.testsfailed > failed_before
    finally:
        stack.stop()
        if failed or os.environ.get("GPUDRA_E2E_KEEP") == "1":
            print(f"\n{what} work dir kept: {stack.workdir} (logs in {stack.logs_dir})")
        else:
            stack.cleanup()
