"""Fixtures of the fault suite: the shared SeaweedFS (tests/conftest.py) behind a
`FaultProxy`, and clusters of real controller/broker processes (`faultkit.ProcessCluster`).

Every test here is marked `faults` and `slow` (both run in CI). Times to serve again are
printed (run with -s to see them) and never asserted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from faultkit import FaultProxy


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def fault_proxy(seaweedfs) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the session's SeaweedFS (healed after every test)."""
    if not seaweedfs.running:
        seaweedfs.start()
    with FaultProxy(seaweedfs.endpoint) as proxy:
        yield proxy


@pytest.fixture
def healed(fault_proxy: FaultProxy) -> Iterator[FaultProxy]:
    yield fault_proxy
    fault_proxy.heal()


@pytest.fixture(scope="module")
def proxied_bucket(seaweedfs, fault_proxy: FaultProxy) -> Iterator[str]:
    """s3:// URL of a fresh bucket reached through the fault proxy."""
    bucket = seaweedfs.create_bucket()
    yield fault_proxy.url_for(bucket)
    if seaweedfs.running:
        try:
            seaweedfs.delete_bucket(bucket)
        except Exception:
            pass
