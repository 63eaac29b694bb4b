"""Property test: random appends, fetches, trims, uploads, restarts and crashes against a
model (a list of batches per stream). Small caches and blocks force every read path:
log cache, block cache, object store, stream-set and stream objects."""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path

import pytest
from engine_setup import node_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automq.broker.objectstore import open_object_store
from automq.broker.storage.api import OffsetOutOfRangeError
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata

STREAMS = 2

append_op = st.tuples(st.just("append"), st.integers(0, STREAMS - 1), st.integers(1, 3000), st.integers(1, 5))
fetch_op = st.tuples(
    st.just("fetch"), st.integers(0, STREAMS - 1), st.floats(0, 1), st.integers(1, 40), st.integers(1, 8000)
)
ops = st.lists(
    st.one_of(
        append_op,
        append_op,
        append_op,
        fetch_op,
        fetch_op,
        st.tuples(st.just("trim"), st.integers(0, STREAMS - 1), st.floats(0, 1)),
        st.tuples(st.just("upload")),
        st.tuples(st.just("restart")),
        st.tuples(st.just("crash")),
    ),
    min_size=10,
    max_size=50,
)


def payload(sid: int, base: int, size: int) -> bytes:
    return bytes([(sid * 7 + base) % 256]) * size


class Model:
    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[int, int, bytes]]] = {s: [] for s in range(STREAMS)}
        self.start: dict[int, int] = dict.fromkeys(range(STREAMS), 0)

    def end(self, sid: int) -> int:
        b = self.batches[sid]
        return b[-1][0] + b[-1][1] if b else 0


async def run(tmp: Path, program: list[tuple], url: str | None = None, wal_kind: str = "volume") -> None:
    url = url or f"file://{tmp}/objects"
    config = node_config(
        tmp / "node",
        url,
        wal={"kind": wal_kind, "capacity": 64 << 10, "s3_bulk_interval_ms": 10},
        storage={
            "log_cache_bytes": 16 << 10,
            "block_cache_bytes": 16 << 10,
            "upload_block_bytes": 8 << 10,
            "upload_interval_ms": 50,
            "stream_split_bytes": 6 << 10,
            "object_block_bytes": 2 << 10,
            "read_ahead_initial_bytes": 2 << 10,
            "read_ahead_max_bytes": 8 << 10,
        },
    )
    store = open_object_store(url)
    meta = InProcessMetadata(store)
    model = Model()
    epochs = dict.fromkeys(range(STREAMS), 0)

    async def boot():
        e = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
        await e.start()
        opened = {}
        for s in range(STREAMS):
            opened[s] = await e.open_stream(s, epochs[s])
            assert opened[s].end_offset == model.end(s), (
                f"stream {s}: engine end {opened[s].end_offset} != model {model.end(s)}"
            )
        return e, opened

    engine = StorageEngine(config, store, meta, meta, 1, await meta.register_node(1))
    await engine.start()
    for _ in range(STREAMS):
        await engine.create_stream()
    await engine.close()
    engine, streams = await boot()
    try:
        for op in program:
            kind = op[0]
            if kind == "append":
                _, sid, size, count = op
                base = streams[sid].end_offset
                data = payload(sid, base, size)
                assert await streams[sid].append(data, count) == base
                model.batches[sid].append((base, count, data))
            elif kind == "fetch":
                _, sid, frac, span, max_bytes = op
                lo, hi = model.start[sid], model.end(sid)
                start = lo + int(frac * (hi - lo))
                result = await streams[sid].fetch(start, start + span, max_bytes)
                expected = [b for b in model.batches[sid] if b[0] + b[1] > start and b[0] < min(start + span, hi)]
                got = [(b.base_offset, b.record_count, bytes(b.payload)) for b in result.batches]
                assert got == expected[: len(got)], f"stream {sid} fetch {start}+{span}: wrong batches"
                if expected:
                    assert got, f"stream {sid} fetch {start}+{span}: nothing returned"
                if len(got) > 1:
                    assert sum(len(b[2]) for b in got) <= max_bytes, "only the first batch may exceed max_bytes"
                if lo > 0:
                    try:
                        await streams[sid].fetch(lo - 1, hi, 100)
                    except OffsetOutOfRangeError:
                        pass
                    else:
                        raise AssertionError(f"stream {sid}: fetch below start {lo} was served")
            elif kind == "trim":
                _, sid, frac = op
                lo, hi = model.start[sid], model.end(sid)
                new = lo + int(frac * (hi - lo))
                await streams[sid].trim(new)
                model.start[sid] = max(lo, new)
            elif kind == "upload":
                await engine.uploader.flush()
            elif kind == "restart":
                await engine.close()
                for s in range(STREAMS):
                    epochs[s] += 1
                engine, streams = await boot()
                for s in range(STREAMS):
                    model.start[s] = max(model.start[s], (await meta.get_streams([s]))[0].start_offset)
                    assert streams[s].start_offset == model.start[s]
            elif kind == "crash":
                engine.uploader._task.cancel()
                if wal_kind == "s3":
                    engine.wal._task.cancel()  # a dead process PUTs nothing more
                else:
                    await engine.wal.close()
                for s in range(STREAMS):
                    epochs[s] += 1
                engine, streams = await boot()
                for s in range(STREAMS):
                    # a trim is durable once trim() returned; the start never goes backwards
                    assert streams[s].start_offset == model.start[s]
        # finally every stream reads back completely and in order
        for s in range(STREAMS):
            pos, hi = model.start[s], model.end(s)
            got = []
            while pos < hi:
                r = await streams[s].fetch(pos, hi, 1 << 20)
                assert r.batches
                got.extend((b.base_offset, b.record_count, bytes(b.payload)) for b in r.batches)
                pos = r.batches[-1].next_offset
            assert got == [b for b in model.batches[s] if b[0] + b[1] > model.start[s]]
    finally:
        await engine.close()
        await store.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
def test_engine_matches_model(program):
    with tempfile.TemporaryDirectory(prefix="storage-model-") as tmp:
        asyncio.run(run(Path(tmp), program))


@pytest.mark.s3
def test_engine_on_s3_wal_matches_model(seaweedfs, tmp_path):
    """The same model check with the S3 WAL on SeaweedFS: a few programs drawn at random
    (hypothesis cannot shrink across a session server, so plain random programs)."""
    rng = random.Random()
    for i in range(3):
        program = []
        for _ in range(rng.randint(15, 35)):
            k = rng.choice(["append"] * 3 + ["fetch"] * 2 + ["trim", "upload", "restart", "crash"])
            sid = rng.randrange(STREAMS)
            if k == "append":
                program.append((k, sid, rng.randint(1, 3000), rng.randint(1, 5)))
            elif k == "fetch":
                program.append((k, sid, rng.random(), rng.randint(1, 40), rng.randint(1, 8000)))
            elif k == "trim":
                program.append((k, sid, rng.random()))
            else:
                program.append((k,))
        if not seaweedfs.running:  # another test's fault injection left it stopped
            seaweedfs.start()
        bucket = seaweedfs.create_bucket()
        try:
            asyncio.run(run(tmp_path / str(i), program, seaweedfs.url_for(bucket), "s3"))
        except BaseException:
            print("failing program:", program)
            raise
        finally:
            try:
                seaweedfs.delete_bucket(bucket)
            except Exception:  # cleanup only
                pass
