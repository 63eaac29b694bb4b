"""Fixtures of the Spark job tests: ONE Spark session (local[2]) and ONE small cluster
(a controller and a broker process, started from the same configs `automq local up` writes,
with uploads every ~0.5 s so data reaches objects quickly) for the whole run, and ONE
PostgreSQL server (`postgres`) for the tests of PostgreSQL-backed Iceberg catalogs.

Tests use their own topics. Helpers to produce with real clients and to wait until the
brokers uploaded everything live in `SparkHelpers` (test modules cannot import conftest).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from automq.broker import local
from automq.broker.controller.client import ControllerClient

START_TIMEOUT_S = 180.0


@dataclass
class SparkCluster:
    data_dir: Path
    bootstrap: str
    controller_url: str
    object_store_url: str
    nodes: list

    def committed_ends(self, topic: str) -> dict[int, int]:
        async def go() -> dict[int, int]:
            async with ControllerClient([self.controller_url]) as c:
                image = await c.watch_metadata(-1, 0)
                t = next(t for t in image.topics if t.name == topic)
                streams = {s.stream_id: s for s in await c.get_streams([p.stream_id for p in t.partitions])}
                return {p.partition: streams[p.stream_id].end_offset for p in t.partitions}

        return asyncio.run(go())

    def wait_uploaded(self, topic: str, expected: dict[int, int] | int, timeout: float = 90.0) -> None:
        """Until the committed end offsets reach `expected` ({partition: end} or a total)."""
        deadline = time.monotonic() + timeout
        ends: dict[int, int] = {}
        while time.monotonic() < deadline:
            ends = self.committed_ends(topic)
            if isinstance(expected, int):
                if sum(ends.values()) >= expected:
                    return
            elif all(ends.get(p, 0) >= e for p, e in expected.items()):
                return
            time.sleep(0.3)
        raise AssertionError(f"{topic}: committed ends {ends} did not reach {expected} within {timeout}s")


def start_cluster(
    data_dir: Path, upload_interval: str = "500ms", upload_block: str = "256KiB", object_store_url: str | None = None
) -> SparkCluster:
    port = local.free_port_block(1)
    nodes = local.prepare(1, data_dir, port, object_store_url, {"kafka": {"group_initial_rebalance_delay_ms": 0}})
    for node in nodes:
        raw = yaml.safe_load(node.config_path.read_text())
        if node.role == "broker":
            raw["storage"] = {"upload_interval_ms": upload_interval, "upload_block_bytes": upload_block}
        else:
            raw["controller"] = {"gc_interval_ms": "1s"}
            raw["storage"] = {"object_gc_retention_ms": "5s"}
        node.config_path.write_text(yaml.safe_dump(raw))
    for node in nodes:
        local.spawn(node)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not local.is_ready(node):
            if node.process.poll() is not None or time.monotonic() > deadline:
                local.stop(nodes, Console(quiet=True))
                raise RuntimeError(f"{node.name} did not start:\n{local.log_tail(node, 40)}")
            time.sleep(0.2)
    url = yaml.safe_load((data_dir / "cluster.yaml").read_text())["object_store_url"]
    return SparkCluster(data_dir, f"127.0.0.1:{port}", f"http://127.0.0.1:{nodes[0].http_port}", url, nodes)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("session-spark-cluster"))
    try:
        yield cluster
    finally:
        local.stop(cluster.nodes, Console(quiet=True), broker_grace_s=20)


@pytest.fixture(scope="session")
def postgres() -> Iterator:
    """ONE real PostgreSQL server for the run (tests/support/postgres_server.py), for the
    lake tests' SQL catalogs; each test makes its own database. Skipped where the server
    binaries are missing (scripts/install-system-deps.sh installs them). The port: a free one,
    or $AUTOMQ_TEST_POSTGRES_PORT."""
    from postgres_server import PostgresServer, PostgresUnavailable, find_binaries, make_root

    try:
        find_binaries()
        root = make_root("session-postgres-")  # not under pytest's temp root: see make_root
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    port = int(os.environ.get("AUTOMQ_TEST_POSTGRES_PORT") or local.free_port_block(1))
    server = PostgresServer(root, port)
    try:
        server.start()
    except Exception as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


TABLE_ENABLE = "automq.table.topic.enable"


def delete_table_topics(bootstrap: str) -> list[str]:
    """Deletes every topic with `automq.table.topic.enable=true`; returns their names."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [n for n in admin.list_topics(timeout=10).topics if not n.startswith("__")]
    if not names:
        return []
    resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]
    enabled = []
    for resource, future in admin.describe_configs(resources).items():
        entry = future.result(30).get(TABLE_ENABLE)
        if entry is not None and entry.value == "true":
            enabled.append(resource.name)
    if enabled:
        for f in admin.delete_topics(enabled, operation_timeout=30).values():
            f.result(60)
    return enabled


@pytest.fixture(autouse=True)
def _table_topics_do_not_outlive_their_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A run over the enabled topics (`ingest(...)` by default, `automq spark ingest` without
    --only) would otherwise also ingest every table topic an earlier test of the session left
    on the shared cluster: the tests would depend on their order."""
    yield
    cluster = request.node.funcargs.get("spark_cluster") if hasattr(request.node, "funcargs") else None
    if isinstance(cluster, SparkCluster):
        delete_table_topics(cluster.bootstrap)


@pytest.fixture(scope="session")
def spark(seaweedfs):
    """Starts after SeaweedFS exported its credentials: Spark's Python workers inherit the
    JVM's environment as it was at launch, so S3 jobs can run in this session too (instead of
    each starting a JVM of its own as a process)."""
    from automq.spark.session import spark_session

    session = spark_session("local[2]", app_name="automq-tests", shuffle_partitions=2)
    yield session
    session.stop()


def topic_name(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs or {})], operation_timeout=30
    )
    futures[name].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        ok = t is not None and t.error is None and len(t.partitions) == partitions
        if ok and all(p.leader >= 0 and p.error is None for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name}: no leaders")


def produce_confluent(bootstrap: str, topic: str, records: list[tuple], **config) -> dict[int, int]:
    """records: (key, value, headers, partition or None). Returns {partition: next offset}."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **config})
    ends: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    for key, value, headers, partition in records:
        kwargs = {"partition": partition} if partition is not None else {}
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    return ends


def produce_kafka_python(bootstrap: str, topic: str, records: list[tuple], **config) -> dict[int, int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **config)
    try:
        futures = [
            # kafka-python sends no null header values
            producer.send(
                topic, key=key, value=value, headers=[(k, v or b"") for k, v in headers or []], partition=partition
            )
            for key, value, headers, partition in records
        ]
        producer.flush(60)
        ends: dict[int, int] = {}
        for f in futures:
            md = f.get(30)
            ends[md.partition] = max(ends.get(md.partition, 0), md.offset + 1)
    finally:
        producer.close(5)
    return ends


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> list[tuple]:
    """(partition, offset, timestamp, key, value, headers) of every record, via confluent-kafka."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append(
                (
                    msg.partition(),
                    msg.offset(),
                    msg.timestamp()[1],
                    msg.key(),
                    msg.value(),
                    [(k, v) for k, v in (msg.headers() or [])],
                )
            )
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
    return sorted(out, key=lambda r: (r[0], r[1]))


def stop_cluster(cluster: SparkCluster) -> None:
    local.stop(cluster.nodes, Console(quiet=True), broker_grace_s=20)


class SparkHelpers:
    start_cluster = staticmethod(start_cluster)
    stop_cluster = staticmethod(stop_cluster)
    topic_name = staticmethod(topic_name)
    create_topic = staticmethod(create_topic)
    produce_confluent = staticmethod(produce_confluent)
    produce_kafka_python = staticmethod(produce_kafka_python)
    consume_all = staticmethod(consume_all)


@pytest.fixture(scope="session")
def sh() -> type[SparkHelpers]:
    return SparkHelpers


@pytest.fixture
def catalog(tmp_path):
    """A test's own sqlite Iceberg catalog, warehouse under tmp_path/lake."""
    from automq.spark import iceberg

    cat = iceberg.open_catalog(f"sqlite:///{tmp_path}/lake/catalog.db")
    cat.warehouse_dir = tmp_path / "lake" / "warehouse"
    return cat


@pytest.fixture
def location(spark_cluster):
    """Where the session cluster's metadata and objects are, for ingest()."""
    from automq.spark.cluster import ClusterLocation

    return ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
