"""Reading one stream's offset range out of one object, straight from the object store, and
turning its Kafka batches into Arrow record batches. Runs on Spark executors (and in the
single-process baseline of the benchmark): no Spark imports here.

Requests per object: one ranged GET of the tail (footer + index, usually), then one ranged
GET per run of adjacent blocks the range needs (a stream's blocks are contiguous in an
object, so usually exactly one). A reader that passes `indexes` fetches each object's tail
once for all the streams (partitions) it reads out of that object.

Transactions (`read_stream_arrow`): what a read_committed consumer sees. Markers (control
batches) are never rows. A transactional batch of producer P counts only if the next marker
of P after it is a COMMIT; it is held back until that marker is read, looking past the task's
own range into the stream's following slices when needed (headers only matter there). A
transaction without a marker up to the planned end is open: its batches are left out, and
with `report_open` one row with `timestamp_type = OPEN_TRANSACTION` at its first offset says
so (the ingestion job stops each partition at the first open transaction, its last stable
offset, and resumes there).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from automq.broker.kafka import records
from automq.broker.objectstore import ObjectStore
from automq.broker.objectstore.local import LocalObjectStore
from automq.broker.storage.metadata import object_key
from automq.broker.storage.objects.format import (
    FOOTER,
    TAIL_READ_BYTES,
    IndexEntry,
    ObjectIndex,
    iter_block_batches,
    parse_index,
    parse_tail,
)

# Exactly the Arrow schema Spark derives from ROW_DDL (it checks batches against it): every
# field nullable, list items named "element", timestamps in UTC.
HEADER_FIELDS = [pa.field("key", pa.string()), pa.field("value", pa.binary())]
HEADER_TYPE = pa.list_(pa.field("element", pa.struct(HEADER_FIELDS)))
ROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),  # 0 CreateTime, 1 LogAppendTime
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
    ]
)
# The same, as a Spark DDL string (the data source's schema)
ROW_DDL = (
    "topic string, partition int, offset long, timestamp timestamp, timestamp_type int, "
    "key binary, value binary, headers array<struct<key:string,value:binary>>"
)
MAX_ROWS_PER_BATCH = 65_536
OPEN_TRANSACTION = -1  # timestamp_type of the row that reports an open transaction's first offset


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """What one read task does: offsets [start, end) of one stream held by one object."""

    object_id: int
    object_size: int
    stream_id: int
    start_offset: int
    end_offset: int
    topic: str = ""
    partition: int = -1

    @property
    def key(self) -> str:
        return object_key(self.object_id)


@dataclass(slots=True)
class ReadStats:
    gets: int = 0
    bytes: int = 0
    records: int = 0


async def _get(store: ObjectStore, key: str, start: int, end: int) -> bytes:
    # This module runs on executor tasks and single-process readers, each with a loop of its
    # own and one read at a time: a local store's read is cheaper on this thread than on its
    # thread pool (LocalObjectStore.get_blocking).
    if isinstance(store, LocalObjectStore):
        return store.get_blocking(key, start, end)
    return await store.get(key, start, end)


async def read_index(store: ObjectStore, key: str, size: int, stats: ReadStats | None = None) -> ObjectIndex:
    """The index of the object `key` of `size` bytes: one ranged GET of its tail (two when
    the index is larger)."""
    stats = stats if stats is not None else ReadStats()
    tail_start = max(0, size - TAIL_READ_BYTES)
    tail = await _get(store, key, tail_start, size)
    stats.gets += 1
    stats.bytes += len(tail)
    index_pos, index_len, crc = parse_tail(tail[-FOOTER.size :], size, key=key)
    if index_pos >= tail_start:
        raw_index = tail[index_pos - tail_start : index_pos - tail_start + index_len]
    else:
        raw_index = await _get(store, key, index_pos, index_pos + index_len)
        stats.gets += 1
        stats.bytes += len(raw_index)
    return parse_index(raw_index, crc, size, key=key)


async def read_slice_batches(
    store: ObjectStore,
    sl: ObjectSlice,
    stats: ReadStats | None = None,
    indexes: dict[int, ObjectIndex] | None = None,
):
    """Yield (base_offset, record_count, batch bytes) of the stored batches that overlap the
    slice, in offset order (whole batches: a batch may start before or end after it).
    `indexes`: parsed indexes by object id, shared by the slices of one reader: a stream-set
    object holds several partitions' slices, and its tail is then read and parsed once
    (objects are immutable, so a parsed index never goes stale)."""
    stats = stats if stats is not None else ReadStats()
    index = indexes.get(sl.object_id) if indexes is not None else None
    if index is None:
        index = await read_index(store, sl.key, sl.object_size, stats)
        if indexes is not None:
            indexes[sl.object_id] = index
    blocks = index.blocks(sl.stream_id, sl.start_offset, sl.end_offset)
    for run in _adjacent_runs(blocks):
        first, last = run[0], run[-1]
        data = await _get(store, sl.key, first.position, last.position + last.size)
        stats.gets += 1
        stats.bytes += len(data)
        view = memoryview(data)
        for e in run:
            block = view[e.position - first.position : e.position - first.position + e.size]
            for base, count, payload in iter_block_batches(block, key=sl.key):
                if base + count <= sl.start_offset:
                    continue
                if base >= sl.end_offset:
                    return
                yield base, count, payload


def _adjacent_runs(blocks: list[IndexEntry]) -> list[list[IndexEntry]]:
    runs: list[list[IndexEntry]] = []
    for b in blocks:
        if runs and runs[-1][-1].position + runs[-1][-1].size == b.position:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


class ArrowBuilder:
    """Columns of decoded records, flushed as Arrow record batches."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        # Headers as flat columns plus each record's end in them: building the list<struct>
        # column from these is far cheaper than from per-record lists of dicts (profiled).
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.header_ends: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add_batch(self, batch: bytes | memoryview, start: int, end: int) -> int:
        """Decode one stored batch, keeping records with offsets in [start, end). Control
        batches (transaction markers) hold no user records and are skipped."""
        header = records.parse_header(batch)
        if header.is_control:
            return 0
        decoded = records.decode_records(batch, header)
        if not decoded:
            return 0  # an empty batch (key compaction keeps a producer's last batch even with no records left)
        if decoded[0][0] < start or decoded[-1][0] >= end:
            decoded = [r for r in decoded if start <= r[0] < end]
        ts_type = 1 if header.attributes & records.TIMESTAMP_TYPE_BIT else 0
        header_keys, header_values, header_ends = self.header_keys, self.header_values, self.header_ends
        for offset, ts, key, value, hdrs in decoded:
            self.offsets.append(offset)
            self.timestamps.append(ts * 1000)
            self.keys.append(key)
            self.values.append(value)
            if hdrs:
                for k, v in hdrs:
                    header_keys.append(k)
                    header_values.append(v)
            header_ends.append(len(header_keys))
        self.types.extend([ts_type] * len(decoded))
        return len(decoded)

    def add_open_transaction(self, first_offset: int) -> None:
        self.offsets.append(first_offset)
        self.timestamps.append(0)
        self.types.append(OPEN_TRANSACTION)
        self.keys.append(None)
        self.values.append(None)
        self.header_ends.append(len(self.header_keys))

    def flush(self) -> pa.RecordBatch | None:
        n = len(self.offsets)
        if not n:
            return None
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.topic] * n, pa.string()),
                pa.array([self.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array(self.types, pa.int32()),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.ListArray.from_arrays(
                    pa.array([0, *self.header_ends], pa.int32()),
                    pa.StructArray.from_arrays(
                        [pa.array(self.header_keys, pa.string()), pa.array(self.header_values, pa.binary())],
                        fields=HEADER_FIELDS,
                    ),
                    type=HEADER_TYPE,
                ),
            ],
            schema=ROW_SCHEMA,
        )
        self._reset()
        return batch


@dataclass(slots=True)
class _OpenTxn:
    first_offset: int
    batches: list[tuple[bytes | memoryview, int, int]]  # (batch, slice start, slice end)


async def read_stream_arrow(
    store: ObjectStore,
    slices: list[ObjectSlice],
    lookahead: tuple[ObjectSlice, ...] = (),
    stats: ReadStats | None = None,
    *,
    report_open: bool = False,
    indexes: dict[int, ObjectIndex] | None = None,
):
    """Arrow record batches of consecutive slices of ONE stream, as read_committed shows them
    (see the module docstring); `lookahead`: the stream's slices after them, for markers."""
    builder = ArrowBuilder(slices[0].topic, slices[0].partition)
    pending: dict[int, _OpenTxn] = {}

    def add(batch: bytes | memoryview, start: int, end: int) -> None:
        n = builder.add_batch(batch, start, end)
        if stats is not None:
            stats.records += n

    def marker(header: records.BatchHeader, batch: bytes | memoryview) -> None:
        txn = pending.pop(header.producer_id, None)
        if txn is not None and records.control_type(batch, header) == records.CONTROL_COMMIT:
            for held, start, end in txn.batches:
                add(held, start, end)

    for sl in slices:
        async for base, _count, payload in read_slice_batches(store, sl, stats, indexes):
            header = records.parse_header(payload)
            if header.is_control:
                marker(header, payload)
            elif header.is_transactional:
                txn = pending.setdefault(header.producer_id, _OpenTxn(max(base, sl.start_offset), []))
                txn.batches.append((payload, sl.start_offset, sl.end_offset))
            else:
                add(payload, sl.start_offset, sl.end_offset)
            if len(builder) >= MAX_ROWS_PER_BATCH:
                out = builder.flush()
                if out is not None:
                    yield out
    for sl in lookahead:
        if not pending:
            break
        batches = read_slice_batches(store, sl, stats, indexes)
        async for _base, _count, payload in batches:
            header = records.parse_header(payload)
            if header.is_control and header.producer_id in pending:
                marker(header, payload)
                if not pending:
                    break
        await batches.aclose()
        if len(builder) >= MAX_ROWS_PER_BATCH:
            out = builder.flush()
            if out is not None:
                yield out
    if report_open:
        for txn in pending.values():
            builder.add_open_transaction(txn.first_offset)
    out = builder.flush()
    if out is not None:
        yield out


async def read_slice_arrow(
    store: ObjectStore,
    sl: ObjectSlice,
    stats: ReadStats | None = None,
    indexes: dict[int, ObjectIndex] | None = None,
):
    """Yield Arrow record batches (ROW_SCHEMA) of the records in the slice (`indexes`: parsed
    indexes shared across slices, as in read_slice_batches)."""
    builder = ArrowBuilder(sl.topic, sl.partition)
    async for _base, _count, payload in read_slice_batches(store, sl, stats, indexes):
        n = builder.add_batch(payload, sl.start_offset, sl.end_offset)
        if stats is not None:
            stats.records += n
        if len(builder) >= MAX_ROWS_PER_BATCH:
            out = builder.flush()
            if out is not None:
                yield out
    out = builder.flush()
    if out is not None:
        yield out
