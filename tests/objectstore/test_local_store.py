"""What only the local directory store has to prove: atomicity across processes, its on-disk
layout, crash leftovers, and its root directory rules."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from automq.broker.objectstore import BucketNotFound, ObjectNotFound, PreconditionFailed, open_object_store
from automq.broker.objectstore.local import ETAG_XATTR, LocalObjectStore

WORKER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from automq.broker.objectstore import PreconditionFailed, open_object_store

    url, go_file, mode, me, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

    async def main():
        store = open_object_store(url)
        while not os.path.exists(go_file):  # start together to make the race real
            time.sleep(0.001)
        won = []
        if mode == "create":
            for n in range(rounds):
                try:
                    await store.put(f"log/{n:08d}", b"writer-%d" % me, if_none_match=True)
                    won.append(n)
                except PreconditionFailed:
                    pass
        else:  # compare-and-swap increments of one counter
            for _ in range(rounds):
                while True:
                    info = await store.head("counter")
                    value = int(await store.get("counter"))
                    try:
                        await store.put("counter", b"%d" % (value + 1), if_match=info.etag)
                        break
                    except PreconditionFailed:
                        continue
        print(json.dumps(won))

    asyncio.run(main())
    """
)


def run_workers(url: str, tmp_path: Path, mode: str, processes: int, rounds: int) -> list[list[int]]:
    go_file = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(go_file), mode, str(me), str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in range(processes)
    ]
    time.sleep(0.5)  # let the interpreters start; correctness does not depend on this
    go_file.touch()
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        results.append(json.loads(out))
    return results


async def test_conditional_create_race_across_processes(file_url, tmp_path):
    rounds = 40
    winners_by_process = run_workers(file_url, tmp_path, "create", processes=4, rounds=rounds)
    store = open_object_store(file_url)
    for n in range(rounds):
        winners = [me for me, won in enumerate(winners_by_process) if n in won]
        assert len(winners) == 1, f"log/{n:08d}: winners {winners}"
        assert await store.get(f"log/{n:08d}") == b"writer-%d" % winners[0]


async def test_compare_and_swap_counter_across_processes_loses_no_update(file_url, tmp_path):
    store = open_object_store(file_url)
    await store.put("counter", b"0")
    run_workers(file_url, tmp_path, "cas", processes=3, rounds=30)
    assert await store.get("counter") == b"90"


async def test_objects_are_plain_files_with_no_temp_leftovers(tmp_path):
    root = tmp_path / "objects"
    store = LocalObjectStore.from_url(f"file://{root}")
    await store.put("streams/7/obj", b"payload")
    await store.put_multipart("streams/7/big", [b"a" * 100, b"b" * 100])
    assert (root / "streams" / "7" / "obj%obj").read_bytes() == b"payload"
    names = sorted(p.name for p in (root / "streams" / "7").iterdir())
    assert names == ["%lock", "big%obj", "obj%obj"]


async def test_crash_leftovers_and_foreign_files_are_invisible(tmp_path):
    root = tmp_path / "objects"
    store = LocalObjectStore.from_url(f"file://{root}")
    await store.put("k", b"committed")
    # A writer that died between write and rename leaves a temp file; strangers leave junk.
    (root / ".%tmp-deadbeef").write_bytes(b"half-written")
    (root / "notes.txt").write_bytes(b"not an object")
    (root / "bad%zzobj").write_bytes(b"not ours either")
    assert [info.key async for info in store.list()] == ["k"]
    assert await store.get("k") == b"committed"


async def test_etag_is_computed_when_the_xattr_is_missing(tmp_path):
    root = tmp_path / "objects"
    store = LocalObjectStore.from_url(f"file://{root}")
    result = await store.put("k", b"data")
    os.removexattr(root / "k%obj", ETAG_XATTR)  # e.g. copied in by a tool that drops xattrs
    assert (await store.head("k")).etag == result.etag == hashlib.md5(b"data").hexdigest()
    await store.put("k", b"new", if_match=result.etag)
    assert await store.get("k") == b"new"


async def test_a_platform_without_xattr_calls_computes_etags(tmp_path, monkeypatch):
    """macOS's os module has no setxattr/getxattr: the store keeps no ETag xattrs there and
    computes the tags, conditional writes included."""
    for name in ("setxattr", "getxattr", "removexattr", "listxattr"):
        monkeypatch.delattr(os, name, raising=False)
    store = LocalObjectStore.from_url(f"file://{tmp_path}/objects")
    result = await store.put("k", b"data")
    assert (await store.head("k")).etag == result.etag == hashlib.md5(b"data").hexdigest()
    await store.put("k", b"new", if_match=result.etag)
    big = os.urandom(9 << 20)  # past the size that gets a CRC-32C tag where xattrs exist
    tagged = await store.put("big", big)
    assert (await store.head("big")).etag == tagged.etag
    assert await store.get("k") == b"new" and await store.get("big") == big
    await store.close()


async def test_multipart_objects_get_a_crc32c_tag_that_works_like_any_etag(tmp_path):
    import crc32c

    store = LocalObjectStore.from_url(f"file://{tmp_path}/objects")
    parts = [os.urandom(100_000), os.urandom(50_000)]
    data = b"".join(parts)
    result = await store.put_multipart("big", parts)
    assert result.etag == f"{crc32c.crc32c(data):08x}-{len(data)}-c" != hashlib.md5(data).hexdigest()
    assert (await store.head("big")).etag == result.etag
    assert [info.etag async for info in store.list("big")] == [result.etag]
    again = await store.put_multipart("same", [data])  # content-derived: same bytes, same tag
    assert again.etag == result.etag
    # unconditional puts of 8 MiB and more (the uploader's objects) get it too; conditional
    # writes and small objects keep the MD5
    large = os.urandom(8 << 20)
    assert (await store.put("large", large)).etag == f"{crc32c.crc32c(large):08x}-{len(large)}-c"
    assert await store.get("large") == large  # written back in steps: every step in place
    created = await store.put("large-cas", large, if_none_match=True)
    assert created.etag == hashlib.md5(large).hexdigest()
    replaced = await store.put("big", b"small", if_match=result.etag)
    assert replaced.etag == hashlib.md5(b"small").hexdigest()
    with pytest.raises(PreconditionFailed):
        await store.put("big", b"stale", if_match=result.etag)


async def test_missing_root_is_created_and_file_root_is_bucket_not_found(tmp_path):
    store = open_object_store(f"file://{tmp_path}/a/b/objects")
    await store.put("x", b"1")
    assert (tmp_path / "a" / "b" / "objects" / "x%obj").is_file()

    (tmp_path / "plainfile").write_bytes(b"")
    for url in (f"file://{tmp_path}/plainfile", f"file://{tmp_path}/plainfile/objects"):
        blocked = open_object_store(url)
        with pytest.raises(BucketNotFound, match="not a directory"):
            await blocked.put("x", b"1")
        with pytest.raises(BucketNotFound):
            await blocked.get("x")
        with pytest.raises(BucketNotFound):
            [info async for info in blocked.list()]


async def test_key_segments_too_long_for_a_file_name_are_rejected(file_url):
    store = open_object_store(file_url)
    with pytest.raises(ValueError, match="too long"):
        await store.put("s" * 300, b"x")
    await store.put("s" * 200 + "/" + "t" * 200, b"ok")  # long keys are fine, long segments are not
    with pytest.raises(ObjectNotFound):
        await store.get("s" * 200)


async def test_conditional_create_without_hard_link_support(file_url, monkeypatch):
    """Some mounts refuse hard links; the directory lock keeps create-if-absent atomic."""
    import errno

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    store = open_object_store(file_url)
    await store.put("k", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"second", if_none_match=True)
    outcomes = await asyncio.gather(
        *(store.put("race", b"%d" % n, if_none_match=True) for n in range(12)), return_exceptions=True
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
    assert all(isinstance(o, PreconditionFailed) for o in outcomes if isinstance(o, BaseException))
    assert [info.key async for info in store.list()] == ["k", "race"]


async def test_blocking_reads_give_what_get_gives(tmp_path):
    store = open_object_store(f"file://{tmp_path}/store")
    assert isinstance(store, LocalObjectStore)
    await store.put("a/b", b"0123456789")
    for start, end in ((0, None), (2, 5), (7, 100)):
        assert store.get_blocking("a/b", start, end) == await store.get("a/b", start, end)
    with pytest.raises(ObjectNotFound):
        store.get_blocking("a/missing")
    with pytest.raises(ObjectNotFound):
        store.get_blocking("a/b", 10, 12)  # past the end, as get says
    await store.close()


def _page_cache_only(monkeypatch) -> None:
    """Stores opened from now on write through the page cache, as on a filesystem that refuses
    O_DIRECT (the write-back path)."""
    from automq.broker.objectstore import direct_io

    monkeypatch.setattr(direct_io, "supported", lambda directory: False)


def _record_write_backs(monkeypatch) -> list[tuple[str, int, int, int]]:
    """Wraps the store's write-back and fsync: (call, offset, length, bytes in the file then),
    the store writing through the page cache."""
    from automq.broker.objectstore import local

    _page_cache_only(monkeypatch)

    calls: list[tuple[str, int, int, int]] = []
    real_write_back, real_fsync = local._write_back, local.diskio.fullsync

    def write_back(fd: int, offset: int, length: int) -> None:
        calls.append(("write_back", offset, length, os.fstat(fd).st_size))
        real_write_back(fd, offset, length)

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # not the directories' fsyncs
            calls.append(("fsync", 0, 0, os.fstat(fd).st_size))
        real_fsync(fd)

    monkeypatch.setattr(local, "_write_back", write_back)
    monkeypatch.setattr(local.diskio, "fullsync", fsync)
    return calls


async def test_objects_are_written_back_in_small_steps_before_the_sealing_fsync(tmp_path, monkeypatch):
    """A WAL fdatasync on the same disk waits behind at most one step of an object's write-back
    (issue 14); durability still comes from the fsync before the object is renamed into place."""
    from automq.broker.objectstore import local

    if sys.platform.startswith("linux"):
        assert local._sync_file_range is not None  # the real syscall, not the fdatasync fallback
    step = local._WRITEBACK_STEP
    store = open_object_store(f"file://{tmp_path}/store")
    calls = _record_write_backs(monkeypatch)
    whole = os.urandom(4 * step + 123)
    parts = [os.urandom(step + 7), os.urandom(3 * step - 5), os.urandom(10)]
    await store.put("big", whole)
    await store.put_multipart("multi", parts)
    for data in (whole, b"".join(parts)):
        ends = [i for i, call in enumerate(calls) if call[0] == "fsync"]
        mine, calls[: ends[0] + 1] = calls[: ends[0]], []
        assert mine, "no write-back steps before the fsync"
        position = 0
        for _kind, offset, length, size_then in mine:
            assert offset == position and 0 < length <= step
            assert size_then >= offset + length  # written before it is written back
            position += length
        assert position == len(data)
    assert await store.get("big") == whole
    assert await store.get("multi") == b"".join(parts)
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".%tmp-")]
    await store.close()


async def test_a_failed_write_back_fails_the_put_and_leaves_nothing(tmp_path, monkeypatch):
    import ctypes
    import errno

    from automq.broker.objectstore import ObjectStoreError, local

    def failing(fd: int, offset: int, length: int, flags: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(local, "_sync_file_range", failing)
    store = open_object_store(f"file://{tmp_path}/store")
    with pytest.raises(ObjectStoreError, match="sync_file_range"):
        await store.put("big", os.urandom(local._WRITEBACK_STEP + 1))
    with pytest.raises(ObjectNotFound):
        await store.get("big")
    assert [p.name for p in (tmp_path / "store").iterdir() if not p.name.startswith("%lock")] == []
    await store.close()


async def test_write_back_falls_back_to_a_data_sync_every_4_mib_where_sync_file_range_is_refused(tmp_path, monkeypatch):
    """Refused by the filesystem (or off Linux, where there is none): a data sync each time the
    object crosses a 4 MiB boundary, not one per 256 KiB step (macOS's F_FULLFSYNC flushes the
    drive's cache each time)."""
    import ctypes
    import errno

    from automq.broker.objectstore import local

    def refused(fd: int, offset: int, length: int, flags: int) -> int:
        ctypes.set_errno(errno.ENOSYS)
        return -1

    datasyncs: list[int] = []
    real = local.diskio.datasync

    def datasync(fd: int) -> None:
        datasyncs.append(os.fstat(fd).st_size)
        real(fd)

    _page_cache_only(monkeypatch)
    monkeypatch.setattr(local, "_sync_file_range", refused)
    monkeypatch.setattr(local.diskio, "datasync", datasync)
    store = open_object_store(f"file://{tmp_path}/store")
    data = os.urandom(9 * local._FALLBACK_STEP // 4 + 1)  # crosses 4 and 8 MiB
    await store.put("big", data)
    assert len(datasyncs) == 2
    assert [size // local._FALLBACK_STEP for size in datasyncs] == [1, 2]
    assert await store.get("big") == data
    await store.close()


async def test_a_store_without_fsync_does_no_write_back(tmp_path, monkeypatch):
    store = open_object_store(f"file://{tmp_path}/store?fsync=false")
    calls = _record_write_backs(monkeypatch)
    data = os.urandom(3 << 20)
    await store.put("big", data)
    assert calls == []
    assert await store.get("big") == data
    await store.close()


def test_put_parts_writes_runs_of_parts_not_one_joined_object():
    from automq.broker.objectstore import local

    run = local._JOIN_RUN
    big = os.urandom(run + 1)
    parts = [os.urandom(1000) for _ in range(500)] + [big] + [memoryview(os.urandom(run))] + [b"x"] * 3
    ends = list(itertools.accumulate(len(p) for p in parts))
    runs = list(local._joined_runs(parts, ends))
    assert b"".join(runs) == b"".join(parts)
    assert any(r is big for r in runs)  # a part of a run's size or more is passed on, not copied
    assert all(len(r) <= run for r in runs if r is not big)
    assert len(runs) < len(parts) // 50  # small parts are joined into runs
    assert list(local._joined_runs([], [])) == []


async def test_put_parts_of_an_uploaded_object_is_written_back_in_steps(tmp_path, monkeypatch):
    from automq.broker.objectstore import local

    store = open_object_store(f"file://{tmp_path}/store")
    calls = _record_write_backs(monkeypatch)
    parts = [os.urandom(1024) for _ in range(2000)]
    await store.put_parts("objects/x", parts)
    steps = [c for c in calls if c[0] == "write_back"]
    assert sum(c[2] for c in steps) == len(parts) * 1024
    assert all(c[2] <= local._WRITEBACK_STEP for c in steps) and calls[-1][0] == "fsync"
    assert await store.get("objects/x") == b"".join(parts)
    await store.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "page-cache"])
async def test_paced_puts_wait_for_the_pace_after_each_step_and_run_one_at_a_time(tmp_path, monkeypatch, direct):
    """The uploader's objects are written at its pace (broker/storage/upload/pace.py): the
    writing thread hands every written step to the pace, and two paced puts never write at
    the same time (they would only share the rate and hand the GIL around more)."""
    import threading

    from automq.broker.objectstore import direct_io, local

    if not direct:
        _page_cache_only(monkeypatch)
    step = direct_io.STAGING_BYTES if direct else local._WRITEBACK_STEP

    class Recording:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.taken: list[tuple[int, int]] = []  # (thread id, bytes)

        def take(self, nbytes: int) -> None:
            with self.lock:
                self.taken.append((threading.get_ident(), nbytes))
            time.sleep(0.001)  # what a pace does: the other put would get in here if it could

    store = open_object_store(f"file://{tmp_path}/store")
    pace = Recording()
    a = [os.urandom(1024) for _ in range(1500)]
    b = [os.urandom(1024) for _ in range(1500)]
    await asyncio.gather(store.put_parts("objects/a", a, pace=pace), store.put_parts("objects/b", b, pace=pace))
    if direct:
        assert store._direct
    # every byte once; a direct write's last block is padded to the alignment
    assert 3000 * 1024 <= sum(n for _, n in pace.taken) <= 3000 * 1024 + 2 * direct_io.ALIGN
    assert all(n <= step for _, n in pace.taken)
    threads = [tid for tid, _ in pace.taken]
    first = threads[0]
    switch = threads.index(next(t for t in threads if t != first)) if len(set(threads)) > 1 else len(threads)
    assert set(threads[:switch]) == {first} and first not in threads[switch:]  # one put, then the other
    assert await store.get("objects/a") == b"".join(a) and await store.get("objects/b") == b"".join(b)
    await store.put_parts("objects/c", a)  # no pace: as before
    assert len(pace.taken) == len(threads)
    await store.close()
