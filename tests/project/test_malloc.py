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
