"""Disk full under the embedded object store (file://, local mode): uploads and metadata
writes fail with ENOSPC while acks=all idempotent produce goes on; when space is freed,
everything acknowledged is there exactly once.

Needs a small filesystem of its own: a tmpfs mounted for the test, which takes root (or
CAP_SYS_ADMIN). Where mounting is not allowed the test is skipped and says so."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from faultkit import ProcessCluster, SequenceProducer, verify

FS_BYTES = 96 << 20


@pytest.fixture
def small_fs(tmp_path: Path):
    mount = tmp_path / "small-fs"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({result.stderr.strip() or result.returncode}): needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(path: Path, leave: int) -> None:
    """Write zeros to `path` until the filesystem has about `leave` bytes free."""
    st = os.statvfs(path.parent)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(path, "wb") as f, contextlib.suppress(OSError):
        chunk = b"\0" * (1 << 20)
        while size > 0:
            f.write(chunk[: min(size, len(chunk))])
            size -= len(chunk)


def test_object_store_disk_full_then_freed(tmp_path_factory, small_fs: Path) -> None:
    overrides = {
        "session_timeout_ms": 6_000,
        "heartbeat_interval_ms": 500,
        "storage": {"upload_interval_ms": 1_000, "log_cache_bytes": 32 << 20},
        "wal": {"capacity": 8 << 20},
    }
    objects = small_fs / "objects"
    objects.mkdir()
    with ProcessCluster(
        tmp_path_factory.mktemp("diskfull"), objects.as_uri(), brokers=1, overrides=overrides
    ) as cluster:
        topic = f"diskfull-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 2)
        producer = SequenceProducer(cluster.bootstrap, topic, 2, rate=200, value_size=8 << 10)
        with producer:
            assert producer.wait_acked(200, timeout=60) >= 200
            ballast = small_fs / "ballast"
            _fill(ballast, leave=256 << 10)
            full_at = time.monotonic()
            time.sleep(10)  # uploads hit ENOSPC; the WAL fills; appends wait
            acked_while_full = producer.acked
            ballast.unlink()
            freed = time.monotonic()
            seconds = producer.time_to_serve_again(freed, timeout=150)
            print(
                f"\n[faults] disk-full: {producer.longest_ack_gap(full_at):.2f}s longest ack gap, "
                f"serving again {seconds}s after space was freed; acked when freed {acked_while_full}"
            )
            producer.wait_acked(producer.acked + 200, timeout=60)
        verdict = verify(producer)
        print(f"[faults] disk-full: {verdict.summary()}")
        assert verdict.ok, f"{verdict.summary()}\n{cluster.log_tail(lines=20)}"
        assert seconds is not None, cluster.log_tail(lines=30)
        assert cluster.grep_logs("No space left") or cluster.grep_logs("ENOSPC"), "the disk never filled"
