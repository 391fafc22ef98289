"""Fault injection: kill the preparer at a named step, to prove a restart recovers.

``GPUDRA_PREPARER_CRASH_AT=<step>`` makes the process exit at once (status 137,
as if SIGKILLed: no clean-up, no flush) when it reaches that step.
"""

from __future__ import annotations

import os
import sys

ENV = "GPUDRA_PREPARER_CRASH_AT"
STEPS = (
    "after-prepare-started",
    "after-mig-create",
    "after-cdi-write",
    "before-prepare-completed",
)
EXIT_STATUS = 137


class Faults:
    """The crash point configured for this process (none by default)."""

    def __init__(self, crash_at: str = "") -> None:
        if crash_at and crash_at not in STEPS:
            raise ValueError(f"{ENV}={crash_at!r}: unknown step; valid: {', '.join(STEPS)}")
        self.crash_at = crash_at

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get(ENV, ""))

    def hit(self, step: str) -> None:
        if step == self.crash_at:
            sys.stderr.write(f"fault injection: crashing at {step}\n")
            sys.stderr.flush()
            os._exit(EXIT_STATUS)
