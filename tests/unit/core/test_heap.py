"""heap.settle: what a service loaded is frozen out of later collections; garbage is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# In a process of its own: a freeze would otherwise hold the test runner's heap.
PROGRAM = """
import gc, json, logging, weakref
from services.core.kit import heap

logging.basicConfig(level=logging.INFO, format="%(message)s %(after)s")

class Node:
    pass

loaded = [{"node": [i]} for i in range(50_000)]  # a service's load: kept
cycle = Node()
cycle.self = cycle  # garbage only the cycle collector frees
gone = weakref.ref(cycle)
del cycle
gc.collect()
before = len(gc.get_objects(generation=2))
cycle = Node()
cycle.self = cycle
gone = weakref.ref(cycle)
del cycle
heap.settle("the test's load")
after = len(gc.get_objects(generation=2))
frozen = gc.get_freeze_count()
kept = loaded[123]
del loaded  # frozen objects still go with their last reference
print(json.dumps({
    "before": before, "after": after, "frozen": frozen, "left": gc.get_freeze_count(),
    "garbage_freed": gone() is None, "kept": kept["node"],
}))
"""


def test_settle_freezes_the_load_and_frees_the_garbage() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout)
    assert found["before"] > 100_000  # a full collection would walk the whole load
    assert found["after"] < 1_000  # after settling, it walks what came since
    assert found["frozen"] > 100_000
    assert found["frozen"] - found["left"] >= 99_000  # the load's dicts and lists freed
    assert found["garbage_freed"]  # a cycle made before settling was collected, not frozen
    assert found["kept"] == [123]
    assert "heap settled the test's load" in done.stderr
