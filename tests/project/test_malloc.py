"""Node processes set glibc's arena count and mmap threshold (broker/malloc.py), unless the
environment says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

_PROBE = "import json; from automq.broker.malloc import tune_allocator; print(json.dumps(tune_allocator()))"


def _run(probe: str = _PROBE, **env: str) -> Any:
    """`probe`'s last line of output, JSON, from a fresh process without MALLOC_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "AUTOMQ_MALLOC"))}
    out = subprocess.run(
        [sys.executable, "-c", probe], env={**clean, **env}, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_settings_applied_and_environment_wins():
    assert _run() == {"MALLOC_ARENA_MAX": 2, "MALLOC_MMAP_THRESHOLD_": 256 << 10}
    assert _run(MALLOC_ARENA_MAX="8") == {"MALLOC_MMAP_THRESHOLD_": 256 << 10}
    assert _run(AUTOMQ_MALLOC_TUNING="0") == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_heap_stats_see_a_big_buffer_and_reach_the_metrics_page():
    from prometheus_client import CollectorRegistry, generate_latest

    from automq.broker.malloc import HeapCollector, heap_stats

    # In a fresh process tuned as a node is: in this long-lived test process glibc may serve
    # the buffer from free chunks that earlier tests left in the heap (no new mapping at all;
    # a CI run saw 250 MiB of them), whatever the mmap threshold says.
    probe = (
        "import json; from automq.broker.malloc import heap_stats, tune_allocator; tune_allocator(); "
        "before = heap_stats(); big = bytearray(32 << 20); during = heap_stats(); del big; "
        "print(json.dumps([before, during, heap_stats()]))"
    )
    before, during, after = _run(probe)
    assert set(before) == {"in_use", "free", "mmapped"}
    assert during["mmapped"] - before["mmapped"] >= 32 << 20  # above the threshold: its own mapping
    assert during["mmapped"] - after["mmapped"] >= 32 << 20  # handed back
    assert heap_stats() is not None  # and here too
    registry = CollectorRegistry()
    HeapCollector(registry)
    page = generate_latest(registry).decode()
    for state in ("in_use", "free", "mmapped"):
        assert f'automq_process_heap_bytes{{state="{state}"}}' in page
