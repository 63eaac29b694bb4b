"""Node processes set glibc's arena count and mmap threshold (broker/malloc.py), unless the
environment says otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = "import json; from automq.broker.malloc import tune_allocator; print(json.dumps(tune_allocator()))"


def _run(**env: str) -> dict[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "AUTOMQ_MALLOC"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**clean, **env}, check=True, capture_output=True, text=True
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

    before = heap_stats()
    assert before is not None and set(before) == {"in_use", "free", "mmapped"}
    big = bytearray(32 << 20)  # above any mmap threshold: its own mapping
    during = heap_stats()
    assert during is not None and during["mmapped"] - before["mmapped"] >= 32 << 20
    del big
    after = heap_stats()
    assert after is not None and during["mmapped"] - after["mmapped"] >= 32 << 20  # handed back
    registry = CollectorRegistry()
    HeapCollector(registry)
    page = generate_latest(registry).decode()
    for state in ("in_use", "free", "mmapped"):
        assert f'automq_process_heap_bytes{{state="{state}"}}' in page
