"""Which Kubernetes releases the seeded differential tests compare against.

tests/e2e/allocator/test_differential_allocator.py, test_differential_refusals.py and
test_differential_cel.py run against each release's ``reference-allocator``;
:data:`DEFAULT` are the releases ``make test`` runs, ``GPUDRA_DIFF_MINORS``
(e.g. ``37,35,36,34``) picks others. docs/differences.md says why the default
is what it is and what each release measured.
"""

from __future__ import annotations

import os

DEFAULT = (37, 35, 34)  # 1.34 adds about 2 minutes on 2 cores (docs/differences.md)


def minors() -> tuple[int, ...]:
    """The releases to run: ``GPUDRA_DIFF_MINORS`` or :data:`DEFAULT`."""
    raw = os.environ.get("GPUDRA_DIFF_MINORS", "")
    chosen = tuple(int(m) for m in raw.replace(" ", "").split(",") if m)
    return chosen or DEFAULT
