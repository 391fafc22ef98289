"""A long-lived service's loaded state, set aside from the cycle collector.

A service that loads a cluster's worth of objects at start (the claim watcher's
informers, the publisher's inventories) keeps them for its whole life, yet
Python's full collections walk every one of them again and again: at 5,000
nodes the watcher's start-up spent seconds in full collections that freed
nothing, and one during a claim churn stopped it for 1.6 s (bench/scale.py).
:func:`settle` collects once, then freezes what survived (``gc.freeze``): later
collections walk only what came after. Frozen objects are still freed when
their last reference goes; only a reference cycle among them would stay, so a
service settles once, after its start-up load, not after every reload.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def settle(what: str) -> None:
    """Collect, then freeze what survived; ``what`` says which load, for the log."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info(
        "heap settled",
        extra={
            "after": what,
            "frozen": gc.get_freeze_count(),
            "ms": round((time.perf_counter() - started) * 1e3, 1),
        },
    )
