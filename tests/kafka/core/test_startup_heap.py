"""Freezing the start-up heap (broker/node.py freeze_startup_heap) runs on the event loop once
a broker serves: it collects only the young generations (cheap) and moves everything alive
into the permanent generation, so later full collections never walk it (issue 14)."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import gc, json, weakref
from automq.broker.node import freeze_startup_heap

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a

kept = cycle()                 # alive: must end up frozen, not freed
young = cycle()
young_ref = weakref.ref(young)
del young                      # young cyclic garbage: collected before the freeze
tracked = len(gc.get_objects())
generations = []
def seen(phase, info):
    if phase == "start":
        generations.append(info["generation"])
gc.callbacks.append(seen)
frozen = freeze_startup_heap()
gc.callbacks.remove(seen)
print(json.dumps({
    "frozen": frozen,
    "tracked_before": tracked,
    "young_garbage_freed": young_ref() is None,
    "kept_alive": kept.other.other is kept,
    "unfrozen_after": len(gc.get_objects()),
    "generations": generations,
}))
"""


def test_the_start_up_heap_is_frozen_after_a_young_collection():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["young_garbage_freed"] and result["kept_alive"]
    assert result["generations"] and max(result["generations"]) <= 1  # never a full collection on the loop
    assert result["frozen"] >= 0.9 * result["tracked_before"]  # all of it, less young garbage
    assert result["unfrozen_after"] < 100  # a full collection now walks almost nothing
