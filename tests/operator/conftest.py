"""Shared by the operator tests: the kmock emulator with the gaps the tests need filled
(`tests/support/kmock_emulator.py`, shared with the kubelet harness)."""

from __future__ import annotations

import pytest
from kmock_emulator import ScalingEmulator


@pytest.fixture(scope="session")
def emulator_class() -> type[ScalingEmulator]:
    return ScalingEmulator
