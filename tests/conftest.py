"""Shared fixtures: a real SeaweedFS S3 server for the session, a fresh bucket or local
object-store directory per test.

- `seaweedfs` (session, synchronous, started only by tests that ask for it): the running
  server (`.endpoint`, `.access_key`, `.secret_key`, `.stop()`, `.start()` to restart on the
  same ports and data). Its credentials are exported to os.environ (AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION) so every backend and subprocess finds them.
- `s3_url`: `s3://<fresh bucket>?endpoint=...&region=us-east-1&path_style=true`.
- `file_url`: `file://<tmp_path>/objects`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq.broker.objectstore.seaweedfs import SeaweedFS, SeaweedFSStartError

# Test-only helpers shared across folders (kmock emulator, kubelet harness): `import kubelet_harness`.
sys.path.insert(0, str(Path(__file__).parent / "support"))


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(data_dir=tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
    except SeaweedFSStartError as exc:
        pytest.fail(f"could not start SeaweedFS: {exc}", pytrace=False)
    saved = {
        key: os.environ.get(key)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED")
    }
    server.export_environment()
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_url(seaweedfs: SeaweedFS) -> Iterator[str]:
    if not seaweedfs.running:  # a previous fault test left it stopped
        seaweedfs.start()
    bucket = seaweedfs.create_bucket()
    yield seaweedfs.url_for(bucket)
    # Each bucket holds SeaweedFS volumes; drop it so long sessions do not run out.
    if seaweedfs.running:
        try:
            seaweedfs.delete_bucket(bucket)
        except Exception:
            pass


@pytest.fixture
def file_url(tmp_path) -> str:
    return f"file://{tmp_path}/objects"
