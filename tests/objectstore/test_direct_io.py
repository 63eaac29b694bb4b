"""The file store's object data around the page cache (broker/objectstore/direct_io.py):
objects of 1 MiB and more written with O_DIRECT through an aligned staging buffer, aligned
ranged reads straight from the device, everything else through the page cache; the bytes,
sizes and ETags what the page-cache path gives; a filesystem that refuses O_DIRECT (some FUSE
mounts; tmpfs before Linux 6.6) keeps the page-cache path."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from automq.broker.objectstore import ObjectStoreError, direct_io, open_object_store
from automq.broker.objectstore.local import LocalObjectStore

MiB = 1 << 20
SIZES = [MiB, MiB + 1, 3 * MiB + 123, 9 * MiB + 4095]  # 9 MiB: a CRC-32C tag, the others MD5


@pytest.fixture
def direct_dir(tmp_path) -> Path:
    if not direct_io.supported(tmp_path / "probe"):
        pytest.skip(f"{tmp_path} is on a filesystem without O_DIRECT (tmpfs?): nothing direct to test here")
    return tmp_path


def record(monkeypatch, name: str) -> list:
    calls: list = []
    real = getattr(direct_io, name)

    def wrapped(*args):
        result = real(*args)
        calls.append((args, result))
        return result

    monkeypatch.setattr(direct_io, name, wrapped)
    return calls


async def test_big_objects_are_written_direct_with_the_bytes_size_and_etag_of_the_page_cache_path(
    direct_dir, monkeypatch
):
    opened = record(monkeypatch, "open_for_writing")
    direct = open_object_store(f"file://{direct_dir}/direct")
    plain = LocalObjectStore(direct_dir / "plain")
    plain._check_root()
    plain._direct = False  # the reference: the same bytes through the page cache
    for size in SIZES:
        data = os.urandom(size)
        parts = [data[i : i + 24_000] for i in range(0, size, 24_000)]
        pieces = [data[i : i + 5 * MiB] for i in range(0, size, 5 * MiB)]

        async def write(store, kind: str, key: str, data=data, parts=parts, pieces=pieces):
            if kind == "put":
                return await store.put(key, data)
            if kind == "parts":
                return await store.put_parts(key, parts)
            return await store.put_multipart(key, pieces)

        for kind, key in (("put", f"p/{size}"), ("parts", f"q/{size}"), ("multipart", f"m/{size}")):
            before = len(opened)
            result = await write(direct, kind, key)
            assert len(opened) == before + 1, f"{kind} of {size} bytes was not written direct"
            assert await direct.get(key) == data
            assert (await direct.head(key)).size == size == result.size
            reference = await write(plain, kind, key)
            assert result.etag == reference.etag
    small = await direct.put("small", b"x" * 1000)  # below 1 MiB: the page cache
    assert len(opened) == 3 * len(SIZES) and (await direct.head("small")).etag == small.etag
    assert not list((direct_dir / "direct").rglob(".%tmp-*"))
    await direct.close()


async def test_aligned_reads_come_from_the_device_and_the_rest_through_the_page_cache(direct_dir, monkeypatch):
    store = open_object_store(f"file://{direct_dir}/store")
    data = os.urandom(3 * MiB + 777)  # not a multiple of the alignment
    await store.put("o", data)
    assert store.read_alignment == direct_io.ALIGN
    reads = record(monkeypatch, "read_into")
    buf = mmap.mmap(-1, 4 * MiB)
    view = memoryview(buf)
    # aligned start and buffer: straight from the device, up to the object's unaligned end
    n = await store.get_into("o", MiB, view[: 3 * MiB])
    assert n == 2 * MiB + 777 and bytes(view[:n]) == data[MiB:]
    assert reads[-1][1] == n
    # an unaligned start: nothing direct, all of it through the page cache
    n = await store.get_into("o", 5, view[:MiB])
    assert n == MiB and bytes(view[:n]) == data[5 : 5 + MiB] and reads[-1][1] == 0
    # an aligned start into memory that is not aligned: the page cache too
    n = await store.get_into("o", 0, view[1 : 1 + MiB])
    assert n == MiB and bytes(view[1 : 1 + MiB]) == data[:MiB] and reads[-1][1] == 0
    # a buffer that is no multiple of the alignment and ends before the object does
    n = await store.get_into("o", 2 * direct_io.ALIGN, view[: MiB + 10])
    assert n == MiB + 10 and bytes(view[:n]) == data[2 * direct_io.ALIGN : 2 * direct_io.ALIGN + MiB + 10]
    view.release()
    await store.close()


async def test_a_big_direct_read_asks_the_device_one_chunk_at_a_time(direct_dir, monkeypatch):
    store = open_object_store(f"file://{direct_dir}/store")
    data = os.urandom(5 * MiB + 123)
    await store.put("o", data)
    sizes: list[int] = []
    preadv = os.preadv

    def counting(fd, buffers, offset):
        sizes.append(sum(len(b) for b in buffers))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(direct_io.os, "preadv", counting)
    buf = mmap.mmap(-1, 6 * MiB)
    view = memoryview(buf)
    n = await store.get_into("o", 0, view[: 6 * MiB])
    assert n == len(data) and bytes(view[:n]) == data
    assert sizes and max(sizes) <= direct_io.READ_CHUNK_BYTES and len(sizes) >= 5
    view.release()
    await store.close()


async def test_a_failed_direct_write_fails_the_put_and_leaves_nothing(direct_dir, monkeypatch):
    import errno

    def failing(self, length):
        raise OSError(errno.EIO, "Input/output error (injected)")

    monkeypatch.setattr(direct_io.DirectWriter, "_write_out", failing)
    store = open_object_store(f"file://{direct_dir}/store")
    with pytest.raises(ObjectStoreError, match="Input/output error"):
        await store.put_parts("o", [os.urandom(MiB)] * 3)
    assert not await store.exists("o")
    assert not [p for p in (direct_dir / "store").rglob("*") if p.is_file() and not p.name.startswith("%lock")]
    free = len(direct_io._staging._free)
    assert free >= 1  # the failed writer gave its staging buffer back
    await store.close()


async def test_a_filesystem_without_o_direct_keeps_the_page_cache_path(tmp_path, monkeypatch):
    # as a filesystem that refuses O_DIRECT answers
    monkeypatch.setattr(direct_io, "supported", lambda directory: False)
    opened = record(monkeypatch, "open_for_writing")
    store = open_object_store(f"file://{tmp_path}/store")
    data = os.urandom(2 * MiB + 1)
    await store.put("o", data)
    assert store.read_alignment == 0 and opened == []
    buf = mmap.mmap(-1, 4 * MiB)
    assert await store.get_into("o", 0, memoryview(buf)[: 4 * MiB]) == len(data)
    assert buf[: len(data)] == data
    await store.close()
