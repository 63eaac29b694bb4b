"""Reading a planned offset range into the driver for a job (ingestion): the data source's plan
and reader, run as plain Spark tasks whose results are Arrow IPC streams.

Why not `spark.read.format("automq")...toArrow()`: Spark SQL turns every Arrow batch a Python
data source yields into JVM rows, and `toArrow()` turns them back into Arrow for the driver:
two per-row conversions of data the job only hands on. Here each task runs the same
`read_group` (same slices, same transaction handling) and returns its batches as one Arrow
IPC byte string, which the JVM ferries to the driver untouched.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.reader import ROW_SCHEMA, ObjectSlice
from automq.spark.source import (
    DEFAULT_MAX_BYTES_PER_PARTITION,
    SliceGroup,
    by_object,
    plan_slices,
    read_group,
    with_lookahead,
)

MIN_TASK_BYTES = 4 << 20  # below this a task costs more than it reads


def _read_ipc(groups: Iterator[SliceGroup]) -> Iterator[bytes]:
    for group in groups:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, ROW_SCHEMA) as writer:
            for batch in read_group(group.object_store_url, group.slices, group.lookahead, group.report_open):
                writer.write_batch(batch)
        yield sink.getvalue().to_pybytes()


def task_groups(slices: list[ObjectSlice], parallelism: int, max_bytes: int) -> list[list[ObjectSlice]]:
    """The slices cut into read tasks of about equal size: at most `max_bytes` each, not below
    MIN_TASK_BYTES (a task costs more than it reads), and as many tasks as a multiple of
    `parallelism`, so every core gets a task and no core gets an extra wave at the end
    (profiled: `max_bytes` alone packed a 32 MiB range into one task read on one core while
    the other idled, and 4 tasks of a 128 MiB range left one core with two).

    Cut by object (`source.by_object`): all partitions' slices of a stream-set object go to
    the task that reads it, so its tail (footer and index) is fetched and parsed once."""
    return by_object(slices, lambda sizes: _cut(sizes, parallelism, max_bytes))


def _cut(sizes: list[int], parallelism: int, max_bytes: int) -> list[int]:
    """The task of each item: consecutive items, about sum(sizes) / n bytes each."""
    total = sum(sizes)
    if total <= 0:
        return [0] * len(sizes)
    cores = max(1, parallelism)
    n = -(-total // max_bytes)
    n = -(-n // cores) * cores  # whole waves
    n = max(1, min(n, total // MIN_TASK_BYTES, len(sizes)))
    out = []
    seen = 0
    for size in sizes:
        # by where the item's middle falls
        out.append(min(n - 1, (2 * seen + size) * n // (2 * total)))
        seen += size
    return out


def read_range(
    spark,
    location: ClusterLocation,
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    *,
    report_open: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES_PER_PARTITION,
) -> pa.Table:
    """The records of `topic`'s partitions in [start, end), read_committed, as one Arrow table
    (ROW_SCHEMA; with `report_open`, plus one row per open transaction, see reader.py)."""
    view = ClusterView.load(location, [topic])
    slices = plan_slices(view, [topic], {topic: start}, {topic: end})
    if not slices:
        return ROW_SCHEMA.empty_table()
    groups = task_groups(slices, spark.sparkContext.defaultParallelism, max_bytes)
    tasks = [
        SliceGroup(location.object_store_url, tuple(g), ahead, report_open)
        for g, ahead in zip(groups, with_lookahead(groups, slices), strict=True)
    ]
    blobs = spark.sparkContext.parallelize(tasks, len(tasks)).mapPartitions(_read_ipc).collect()
    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs]
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else ROW_SCHEMA.empty_table()
