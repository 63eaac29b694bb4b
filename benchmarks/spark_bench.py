"""Spark jobs benchmark: prints numbers next to a baseline measured in the same run.

    python benchmarks/spark_bench.py [--mib 32] [--master local[2]] [--dir /tmp/spark-bench] [--values json]

Starts a real controller and broker (uploads every 0.5 s / 256 KiB, so the topic lands in
many small stream-set objects), produces --mib MiB with confluent-kafka (1 KiB values,
lz4), waits until it is all in objects, then measures:

1. baseline: a plain single-process read-and-decode of the same object slices
   (`automq.spark.reader.read_slice_arrow`, sequential, no Spark; each object's tail fetched
   and parsed once, as the Spark tasks do) -> MiB/s, records/s;
2. the `automq` data source in Spark (`df.toArrow()` on the driver), the bulk read ingestion
   uses (`automq.spark.bulkread.read_range`: the same plan and reader as Spark tasks returning
   Arrow IPC) and full `automq spark ingest` runs (executors write the data files) into fresh
   sqlite Iceberg catalogs, the first with cold Python workers, the second warm -> MiB/s,
   records/s;
3. compaction (`automq spark compact`, min age 0) -> MiB/s written, objects before/after;
4. cold-read GETs per MiB and single-process read MiB/s before vs after compaction.

`--values json`: ~1 KiB JSON objects (varied, 8 fields) into a JSON table
(`automq.table.topic.convert.value.type=json`); the warm ingestion runs then go into a new
table (tasks infer, the driver creates the table, the tasks run again), into a table that
already has the columns (one pass, the steady state) and through the driver path JSON tables
took before (rows collected and written on the driver), each next to a baseline run.

`--values debezium`: Debezium envelopes upserted on an `id` (half the records update ids the
first half created): the warm runs go through the executors (automq.spark.lakeupsert) and
through the driver path upserts took before, each next to a baseline run.

MiB are of record payload (key + value) as produced. No assertions: it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console

from automq.broker import local
from automq.broker.objectstore import open_object_store
from automq.spark import iceberg, lakewrite
from automq.spark.bulkread import read_range
from automq.spark.cluster import ClusterLocation, ClusterView
from automq.spark.compact import CompactionSettings, compact
from automq.spark.iceberg import open_catalog
from automq.spark.ingest import TableResult, ingest
from automq.spark.reader import ReadStats, read_slice_arrow
from automq.spark.session import spark_session
from automq.spark.source import plan_slices

MiB = 1 << 20
VALUE = 1000


def start_cluster(data_dir: Path, port: int | None = None) -> tuple[list, str]:
    port = port or local.free_port_block(1)
    nodes = local.prepare(1, data_dir, port, None)
    for node in nodes:
        raw = yaml.safe_load(node.config_path.read_text())
        if node.role == "broker":
            raw["storage"] = {"upload_interval_ms": "500ms", "upload_block_bytes": "256KiB"}
        node.config_path.write_text(yaml.safe_dump(raw))
    for node in nodes:
        local.spawn(node)
        deadline = time.monotonic() + 180
        while not local.is_ready(node):
            if node.process.poll() is not None or time.monotonic() > deadline:
                local.stop(nodes, Console(quiet=True))
                raise SystemExit(f"{node.name} did not start:\n{local.log_tail(node, 40)}")
            time.sleep(0.2)
    return nodes, f"127.0.0.1:{port}"


def json_value(i: int, text: str) -> bytes:
    """A ~1 KiB JSON object (VALUE bytes) with fields of several types, varied per record."""
    doc = {
        "id": i,
        "user": f"user-{i * 7919 % 100_003}",
        "score": i % 977 / 7,
        "ok": i % 3 == 0,
        "tags": [f"t{i % 11}", f"t{i % 13}"],
        "geo": {"lat": i % 180 - 90.5, "lon": i % 360 - 180.25},
        "n": i * 31 % 1_000_003,
        "text": "",
    }
    pad = VALUE - len(json.dumps(doc))
    start = i * 37 % (len(text) - pad)
    doc["text"] = text[start : start + pad]
    return json.dumps(doc).encode()


def debezium_value(i: int, n: int, text: str) -> bytes:
    """A Debezium envelope of ~1 KiB: the first half of the records create ids 0..n/2, the
    second half update them (so a run's latest image per id replaces an earlier one)."""
    row = json.loads(json_value(i, text))
    half = max(1, n // 2)
    row["id"] = i % half
    op = "c" if i < half else "u"
    doc = {"payload": {"op": op, "before": None, "after": row, "ts_ms": i}}
    return json.dumps(doc).encode()


def produce(bootstrap: str, topic: str, mib: int, values_kind: str = "raw") -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {"automq.table.topic.convert.value.type": "json"} if values_kind != "raw" else {}
    if values_kind == "debezium":
        configs["automq.table.topic.transform.value.type"] = "flatten_debezium"
        configs["automq.table.topic.id.columns"] = "id"
    admin.create_topics([NewTopic(topic, 2, 1, config=configs)])[topic].result(60)
    time.sleep(2)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "compression.type": "lz4"})
    n = mib * MiB // (VALUE + 8)
    values = [os.urandom(VALUE) for _ in range(64)]  # incompressible: lz4 must not shrink the test
    text = os.urandom(64 << 10).hex()
    for i in range(n):
        if values_kind == "json":
            value = json_value(i, text)
        elif values_kind == "debezium":
            value = debezium_value(i, n, text)
        else:
            value = values[i % 64]
        while True:
            try:
                producer.produce(topic, key=f"{i:08d}".encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 256 == 255:
            # ~256 KiB at a time, as a steady producer would: the broker uploads small objects
            assert producer.flush(60) == 0
            time.sleep(0.05)
    assert producer.flush(120) == 0
    return n


def wait_uploaded(location: ClusterLocation, topic: str, n: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        parts = ClusterView.load(location, [topic], with_objects=False).topic(topic).partitions
        if sum(p.end_offset for p in parts) >= n:
            return
        time.sleep(0.5)
    raise SystemExit("data did not reach objects in time")


def single_process_read(location: ClusterLocation, topic: str) -> tuple[float, int, ReadStats, int]:
    view = ClusterView.load(location, [topic])
    slices = plan_slices(view, [topic])
    objects = len({s.object_id for s in slices})

    async def go() -> tuple[int, ReadStats]:
        stats = ReadStats()
        rows = 0
        indexes: dict = {}  # each object's tail once, as the Spark tasks read it
        store = open_object_store(location.object_store_url)
        try:
            for sl in slices:
                async for batch in read_slice_arrow(store, sl, stats, indexes):
                    rows += batch.num_rows
        finally:
            await store.close()
        return rows, stats

    started = time.perf_counter()
    rows, stats = asyncio.run(go())
    return time.perf_counter() - started, rows, stats, objects


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3, help="warm ingestion runs, each next to a baseline run")
    ap.add_argument("--port", type=int, default=None, help="first port of the local cluster (default: a free one)")
    ap.add_argument(
        "--values", choices=("raw", "json", "debezium"), default="raw", help="record values and the table's conversion"
    )
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="spark-bench-"))
    data_dir = root / "cluster"
    nodes, bootstrap = start_cluster(data_dir, args.port)
    try:
        location = ClusterLocation.resolve(data_dir=data_dir)
        topic = "bench"
        t0 = time.perf_counter()
        n = produce(bootstrap, topic, args.mib, args.values)
        wait_uploaded(location, topic, n)
        payload_mib = n * (VALUE + 8) / MiB
        print(f"produced {n} records, {payload_mib:.1f} MiB payload in {time.perf_counter() - t0:.1f}s (incl. upload)")
        load = os.getloadavg()
        print(
            f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)"
            " before the runs (the 1-minute figure includes the produce above)"
        )

        secs, rows, stats, objects = single_process_read(location, topic)
        print(
            f"\n[baseline] single-process read+decode: {rows} records in {secs:.2f}s = "
            f"{payload_mib / secs:.1f} MiB/s, {rows / secs:,.0f} records/s ({objects} objects, "
            f"{stats.gets} GETs, {stats.gets / (stats.bytes / MiB):.1f} GETs/MiB read)"
        )
        base_secs = secs

        spark = spark_session(args.master, app_name="spark-bench")
        df = spark.read.format("automq").option("topic", topic).options(**location.to_options()).load()
        df.toArrow()  # warm up the JVM and the Python workers: both read paths are timed warm
        started = time.perf_counter()
        table = df.toArrow()
        secs = time.perf_counter() - started
        print(
            f"[spark {args.master}] data source -> Arrow on the driver: {table.num_rows} records in {secs:.2f}s = "
            f"{payload_mib / secs:.1f} MiB/s, {table.num_rows / secs:,.0f} records/s "
            f"({base_secs / secs:.2f}x baseline)"
        )
        del table
        # The path ingestion reads through: the same plan and reader as plain Spark tasks
        # returning Arrow IPC (automq.spark.bulkread), no conversion to JVM rows and back.
        view = ClusterView.load(location, [topic], with_objects=False)
        parts = view.topic(topic).partitions
        start, end = {p.partition: p.start_offset for p in parts}, {p.partition: p.end_offset for p in parts}
        read_range(spark, location, topic, start, end)  # warm-up, as above
        started = time.perf_counter()
        table = read_range(spark, location, topic, start, end)
        secs = time.perf_counter() - started
        print(
            f"[spark {args.master}] bulk read (ingestion's path) -> Arrow on the driver: {table.num_rows} records in "
            f"{secs:.2f}s = {payload_mib / secs:.1f} MiB/s, {table.num_rows / secs:,.0f} records/s "
            f"({base_secs / secs:.2f}x baseline)"
        )
        del table

        # The first run pays the Python workers' imports of the write path (as every run of a
        # CronJob does); then warm runs into fresh catalogs, each next to a baseline run, since
        # other engineers' jobs on the shared cores move single numbers by 2-3x.
        def ingest_once(lake: str, like: str | None = None, driver: bool = False) -> tuple[float, TableResult]:
            """`like`: first create the table with the columns of that lake's table (no rows)."""
            catalog = open_catalog(f"sqlite:///{root}/{lake}/catalog.db")
            if like is not None:
                primed = open_catalog(f"sqlite:///{root}/{like}/catalog.db").load_table(f"kafka.{topic}")
                iceberg.create_table(catalog, f"kafka.{topic}", primed.schema().as_arrow(), topic)
            on_executors = lakewrite.on_executors
            if driver:  # the path JSON tables took before: rows to the driver, converted and written there
                lakewrite.on_executors = lambda settings: False  # type: ignore[assignment]
            try:
                started = time.perf_counter()
                [result] = ingest(spark, location, catalog, [topic], enabled_topics=False)
                return time.perf_counter() - started, result
            finally:
                lakewrite.on_executors = on_executors  # type: ignore[assignment]

        secs, result = ingest_once("lake")
        print(
            f"[spark {args.master}] ingest into Iceberg (cold; sqlite catalog, local warehouse): {result.records} "
            f"records in {secs:.2f}s = {payload_mib / secs:.1f} MiB/s ({base_secs / secs:.2f}x baseline)"
        )
        variants: dict[str, dict] = {"": {}}
        if args.values == "debezium":  # upserts: on the executors (lakeupsert) vs the driver path before
            variants = {" upsert on executors": {}, " upsert driver path (before)": {"driver": True}}
        if args.values == "json":
            variants = {
                " new table": {},
                " table with the columns": {"like": "lake"},
                " driver path (before)": {"driver": True},
            }
        pairs: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        for i in range(args.repeat):
            for label, kwargs in variants.items():
                cpu = time.process_time()
                base_i, *_ = single_process_read(location, topic)
                cpu = time.process_time() - cpu
                secs, result = ingest_once(f"lake-warm-{i}-{len(pairs[label])}{label.replace(' ', '-')}", **kwargs)
                pairs[label].append((base_i, secs))
                print(
                    f"[spark {args.master}] ingest (warm){label} {i + 1}/{args.repeat}: {result.records} records in "
                    f"{secs:.2f}s = {payload_mib / secs:.1f} MiB/s, {result.records / secs:,.0f} records/s; baseline "
                    f"next to it {base_i:.2f}s: {base_i / secs:.2f}x; CPU: executor tasks {result.task_cpu_seconds:.2f}s, "
                    f"baseline {cpu:.2f}s"
                )
        for label, runs in pairs.items():
            ratios = sorted(b / s for b, s in runs)
            print(
                f"[spark {args.master}] ingest (warm){label} vs baseline, median of {len(ratios)}: "
                f"{ratios[len(ratios) // 2]:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f}x)"
            )

        report = compact(spark, location, CompactionSettings(min_age_ms=0, target_bytes=256 << 20))
        print(
            f"\n[compaction] {report.source_objects} source objects -> {report.committed} objects, "
            f"{report.bytes_written / MiB:.1f} MiB written in {report.seconds:.2f}s = "
            f"{report.bytes_written / MiB / report.seconds:.1f} MiB/s (lost {report.lost})"
        )

        secs2, rows2, stats2, objects2 = single_process_read(location, topic)
        print(
            f"[cold reads] before compaction: {objects} objects, {stats.gets} GETs = "
            f"{stats.gets / payload_mib:.2f} GETs per payload MiB, {payload_mib / base_secs:.1f} MiB/s"
        )
        print(
            f"[cold reads] after compaction:  {objects2} objects, {stats2.gets} GETs = "
            f"{stats2.gets / payload_mib:.2f} GETs per payload MiB, {payload_mib / secs2:.1f} MiB/s "
            f"({rows2} records)"
        )
        spark.stop()
    finally:
        local.stop(nodes, Console(quiet=True), broker_grace_s=20)
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
