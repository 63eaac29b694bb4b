"""Crash tests: SIGKILL an appending engine process at random moments (during appends,
uploads and recovery), restart, and find every acknowledged batch exactly once, in order."""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("crash_child.py")
sys.path.insert(0, str(CHILD.parent))
from crash_child import check_payload, open_engine  # noqa: E402 - after the sys.path entry above

STREAMS = 3


def run_and_kill(
    tmp_path: Path,
    store_url: str,
    wal_kind: str,
    seed: int,
    ack_file: Path,
    early: bool,
    delay: float,
    env: dict[str, str] | None = None,
) -> None:
    """Start the child; SIGKILL it `delay` s after start (`early`: likely during recovery)
    or `delay` s after it reported ready (mid-append, mid-upload)."""
    child = subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            str(tmp_path / "node"),
            store_url,
            wal_kind,
            str(seed),
            str(STREAMS),
            str(ack_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    try:
        if not early:
            ready, _, _ = select.select([child.stdout], [], [], 300)  # generous: a loaded CI machine
            line = child.stdout.readline() if ready else b""
            if line.strip() != b"ready":
                child.kill()
                raise AssertionError(f"child did not get ready: {child.stderr.read().decode()[-3000:]}")
        time.sleep(delay)
        if child.poll() is not None:
            raise AssertionError(f"child exited early ({child.returncode}): {child.stderr.read().decode()[-3000:]}")
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()


async def verify(tmp_path: Path, store_url: str, wal_kind: str, ack_file: Path) -> int:
    acked: dict[int, dict[int, int]] = {}
    for line in (ack_file.read_text() if ack_file.exists() else "").splitlines():
        sid, base, count = map(int, line.split())
        acked.setdefault(sid, {})[base] = count
    engine, meta = await open_engine(str(tmp_path / "node"), store_url, wal_kind)
    try:
        assert engine.wal.report.stop_reason in ("end", "empty", "torn")
        total = 0
        for m in await meta.get_streams(list(range(STREAMS))):
            stream = await engine.open_stream(m.stream_id, m.epoch + 1)
            pos, seen = 0, {}
            while pos < stream.confirm_offset:
                result = await stream.fetch(pos, stream.confirm_offset, 1 << 20)
                for b in result.batches:
                    if b.next_offset <= pos:
                        continue
                    assert b.base_offset == pos, (
                        f"stream {m.stream_id}: batch at {b.base_offset}, expected {pos} (gap or overlap)"
                    )
                    check_payload(m.stream_id, b.base_offset, b.record_count, bytes(b.payload))
                    seen[b.base_offset] = b.record_count
                    pos = b.next_offset
            missing = {base: c for base, c in acked.get(m.stream_id, {}).items() if seen.get(base) != c}
            assert not missing, f"stream {m.stream_id}: acknowledged batches lost: {sorted(missing)[:10]}"
            total += len(acked.get(m.stream_id, {}))
        return total
    finally:
        await engine.close()
        await engine.object_store.close()


@pytest.mark.parametrize("wal_kind", ["volume", pytest.param("s3", marks=pytest.mark.s3)])
async def test_sigkill_during_appends_and_uploads_loses_no_acknowledged_batch(tmp_path, request, wal_kind):
    store_url = request.getfixturevalue("file_url" if wal_kind == "volume" else "s3_url")
    ack_file = tmp_path / "acks"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    iterations = 5
    for i in range(iterations):
        early = i > 0 and rng.random() < 0.25  # during startup/recovery of the previous run's WAL
        delay = rng.uniform(0.3, 1.5) if early else rng.uniform(0.1, 2.0)
        await asyncio.to_thread(
            run_and_kill, tmp_path, store_url, wal_kind, rng.randint(0, 1 << 30), ack_file, early, delay
        )
    total = await verify(tmp_path, store_url, wal_kind, ack_file)
    assert total > 0, "the child never acknowledged anything; the test proved nothing"


@pytest.mark.s3
async def test_sigkill_while_s3_wal_puts_complete_out_of_order(tmp_path, s3_url):
    """The S3 WAL with PUTs held back at random (several bulks in flight, later ones stored
    before earlier ones): every kill leaves holes; recovery must replay up to the first hole
    of each incarnation, so no acknowledged batch is lost and no stream gets a gap."""
    ack_file = tmp_path / "acks"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    for _ in range(4):
        await asyncio.to_thread(
            run_and_kill,
            tmp_path,
            s3_url,
            "s3",
            rng.randint(0, 1 << 30),
            ack_file,
            False,
            rng.uniform(0.2, 1.5),
            {"CRASH_CHILD_PUT_JITTER": "1"},
        )
    total = await verify(tmp_path, s3_url, "s3", ack_file)
    assert total > 0, "the child never acknowledged anything; the test proved nothing"
