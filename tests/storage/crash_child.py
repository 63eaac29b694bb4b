"""A storage engine process for crash tests: recovers, then appends until killed.

    python crash_child.py DATA_DIR STORE_URL WAL_KIND SEED STREAMS ACK_FILE

Every batch's payload names its own stream, base offset and record count and is filled
from a seed derived from them, so a verifier can tell a batch is where it belongs. A line
`<stream> <base> <count>` is written to ACK_FILE only after `append` returned (the batch is
acknowledged); the parent SIGKILLs this process at a random moment.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import sys

from automq.broker.config import NodeConfig
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata

HEAD = struct.Struct(">QQI")


def make_payload(stream_id: int, base: int, count: int, size: int) -> bytes:
    head = HEAD.pack(stream_id, base, count)
    filler = random.Random(stream_id * 1_000_003 + base).randbytes(max(0, size - HEAD.size))
    return head + filler


def check_payload(stream_id: int, base: int, count: int, payload: bytes) -> None:
    sid, b, c = HEAD.unpack_from(payload)
    if (sid, b, c) != (stream_id, base, count):
        raise AssertionError(
            f"batch at stream {stream_id} offset {base} holds data of stream {sid} offset {b} count {c}"
        )
    expected = make_payload(stream_id, base, count, len(payload))
    if payload != expected:
        raise AssertionError(f"batch at stream {stream_id} offset {base}: payload bytes differ")


def config(data_dir: str, store_url: str, wal_kind: str) -> NodeConfig:
    return NodeConfig(
        node_id=1,
        data_dir=data_dir,
        object_store_url=store_url,
        wal={"kind": wal_kind, "capacity": 1 << 20, "s3_bulk_interval_ms": 20, "s3_bulk_bytes": 256 << 10},
        storage={
            "upload_block_bytes": 128 << 10,
            "upload_interval_ms": 100,
            "stream_split_bytes": 96 << 10,
            "object_block_bytes": 8 << 10,
            "log_cache_bytes": 2 << 20,
        },
    )


class JitteryWalStore:
    """Fault injection (CRASH_CHILD_PUT_JITTER=1): a third of the S3 WAL's PUTs are held back
    up to 150 ms, so bulks complete out of order and a kill often lands while a later bulk is
    stored and an earlier one is not."""

    def __init__(self, inner, seed: int) -> None:
        self.inner = inner
        self.rng = random.Random(seed)

    async def put(self, key, data, **kw):
        if key.startswith("wal/") and "/data/" in key and self.rng.random() < 0.33:
            await asyncio.sleep(self.rng.uniform(0.0, 0.15))
        return await self.inner.put(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def open_engine(data_dir: str, store_url: str, wal_kind: str) -> tuple[StorageEngine, InProcessMetadata]:
    store = open_object_store(store_url)
    if os.environ.get("CRASH_CHILD_PUT_JITTER"):
        store = JitteryWalStore(store, os.getpid())  # type: ignore[assignment]
    meta = InProcessMetadata(store)
    epoch = await meta.register_node(1)
    engine = StorageEngine(config(data_dir, store_url, wal_kind), store, meta, meta, 1, epoch)
    await engine.start()
    return engine, meta


async def main() -> None:
    data_dir, store_url, wal_kind, seed, streams, ack_file = sys.argv[1:7]
    rng = random.Random(int(seed))
    engine, meta = await open_engine(data_dir, store_url, wal_kind)
    existing = {m.stream_id: m for m in await meta.get_streams(list(range(int(streams))))}
    stream_ids = []
    for i in range(int(streams)):
        if i in existing:
            stream_ids.append(i)
        else:
            stream_ids.append(await engine.create_stream())
    opened = []
    for sid in stream_ids:
        epoch = existing[sid].epoch + 1 if sid in existing else 0
        opened.append(await engine.open_stream(sid, epoch))
    fd = os.open(ack_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", flush=True)

    async def writer(stream) -> None:
        while True:
            count = rng.randint(1, 5)
            size = rng.choice([100, 1000, 5000, 30_000])
            base = stream.end_offset
            await stream.append(make_payload(stream.stream_id, base, count, size), count)
            os.write(fd, f"{stream.stream_id} {base} {count}\n".encode())

    await asyncio.gather(*(writer(s) for s in opened for _ in range(3)))


if __name__ == "__main__":
    asyncio.run(main())
