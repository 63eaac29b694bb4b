"""Fixtures for the storage engine tests: a real object store (file:// by default), the
in-process metadata on it, and an engine factory that can be restarted on the same WAL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from engine_setup import EngineFactory


@pytest.fixture
async def engines(tmp_path, file_url):
    factory = EngineFactory(tmp_path, file_url)
    yield factory
    await factory.close()
