"""Avro table topics through the schema registry the controller serves: records produced by
confluent-kafka's real `SerializingProducer` + `AvroSerializer`, ingested by the Spark job
(`by_schema_id`, `by_latest_schema`), the table's rows equal to what confluent-kafka's
`AvroDeserializer` reads back from the broker, read through pyiceberg, DuckDB and Polars; a
new schema version adds columns; bad records (bad magic byte, unknown id, undecodable body)
follow errors.tolerance. (The topics are not `automq.table.topic.enable`d: other modules'
runs over all enabled topics must not meet them.)"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from decimal import Decimal

import duckdb
import fastavro
import polars as pl
import pytest
from confluent_kafka import SerializingProducer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from lake_tables import data_files, produce_serialized

from automq.spark.cluster import ClusterLocation
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"], "default": None}],
}
V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "blob", "type": "bytes"},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "ship_to", "type": ADDRESS},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
# a new version: a field with a default, and a nested field
V2 = {
    **V1,
    "fields": [
        *[f for f in V1["fields"] if f["name"] != "ship_to"],
        {
            "name": "ship_to",
            "type": {**ADDRESS, "fields": [*ADDRESS["fields"], {"name": "street", "type": "string", "default": ""}]},
        },
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}


def _order(i: int, v2: bool = False) -> dict:
    doc = {
        "id": i,
        "qty": i % 7,
        "price": Decimal(f"{i}.{i % 100:02d}"),
        "ratio": 0.5,
        "ok": i % 2 == 0,
        "note": None if i % 3 == 0 else f"note {i}",
        "blob": bytes([i % 256]) * 3,
        "digest": (i).to_bytes(4, "big"),
        "status": "PAID" if i % 2 else "NEW",
        "tags": [f"t{j}" for j in range(i % 3)],
        "attrs": {"n": i, "m": -i} if i % 2 else {},
        "ship_to": {"city": f"c{i}", "zip": None if i % 4 == 0 else 10_000 + i},
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
        "at_ms": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=1_000 * i + 7),
        "at_us": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=i + 1),
        "ref": uuid.UUID(int=i + 1),
    }
    if v2:
        doc["ship_to"]["street"] = f"s{i}"
        doc["coupon"] = f"C{i}" if i % 2 else None
    return doc


def _produce(bootstrap: str, registry: str, topic: str, schema: dict, docs: list[tuple[int, dict]]) -> dict[int, int]:
    serializer = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(schema))
    return produce_serialized(bootstrap, topic, serializer, docs)


def _expected(sh, bootstrap: str, registry: str, topic: str, count: int) -> dict[tuple[int, int], dict | None]:
    """What a confluent-kafka consumer with an AvroDeserializer reads: {(partition, offset): value}."""
    de = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    out = {}
    for p, o, _ts, _key, value, _headers in sh.consume_all(bootstrap, topic, count):
        try:
            out[(p, o)] = de(value, ctx)
        except Exception:
            out[(p, o)] = None  # a bad record: the table must not have it
    return out


def _as_table_value(doc: dict) -> dict:
    """A deserialized record as the table holds it (uuid as text, maps as pairs)."""
    doc = dict(doc)
    doc["ref"] = str(doc["ref"])
    doc["attrs"] = sorted(doc["attrs"].items())
    return doc


def test_by_schema_id_rows_equal_what_avro_consumers_read_and_evolve(spark, spark_cluster, sh, catalog):
    registry = spark_cluster.controller_url  # the controller serves the schema registry
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("avro")
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        partitions=2,
        configs={"automq.table.topic.convert.value.type": "by_schema_id", "automq.table.topic.errors.tolerance": "all"},
    )
    ends = _produce(spark_cluster.bootstrap, registry, topic, V1, [(i % 2, _order(i)) for i in range(40)])
    # bad records: no magic byte, an id the registry never gave, a body that does not decode
    known_id = SchemaRegistryClient({"url": registry}).get_latest_version(f"{topic}-value").schema_id
    bad = [(None, b"plain text", [], 0), (None, b"\x00\x7f\xff\xff\x01abc", [], 1)]
    bad += [(None, b"\x00" + known_id.to_bytes(4, "big") + b"\x02", [], 0)]
    sh.produce_confluent(spark_cluster.bootstrap, topic, bad)
    ends = {p: ends[p] + (2 if p == 0 else 1) for p in ends}
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.dead_letters, r1.offsets) == ("committed", 40, 3, ends), r1

    # version 2 adds a column and a nested field; the table is widened, the old rows keep nulls
    more = _produce(spark_cluster.bootstrap, registry, topic, V2, [(i % 2, _order(i, v2=True)) for i in range(40, 50)])
    ends = {p: max(ends[p], more[p]) for p in ends}
    spark_cluster.wait_uploaded(topic, ends)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r2.status, r2.records, r2.dead_letters, r2.offsets) == ("committed", 10, 0, ends), r2

    expected = _expected(sh, spark_cluster.bootstrap, registry, topic, sum(ends.values()))
    good = {k: v for k, v in expected.items() if v is not None}
    assert len(good) == 50 and len(expected) == 53
    table = catalog.load_table(r1.table)
    schema = table.schema()
    assert str(schema.find_field("price").field_type) == "decimal(9, 2)"
    assert str(schema.find_field("at_ms").field_type) == "timestamptz"
    assert str(schema.find_field("day").field_type) == "date"
    assert str(schema.find_field("digest").field_type) == "fixed[4]"
    assert str(schema.find_field("ship_to").field_type).startswith("struct<")
    rows = table.scan().to_arrow().to_pylist()
    got = {(r["_kafka_partition"], r["_kafka_offset"]): r for r in rows}
    assert set(got) == set(good)
    for key, doc in good.items():
        row = got[key]
        want = _as_table_value(doc)
        for name, value in want.items():
            if name == "ship_to":
                assert {k: v for k, v in row[name].items() if k in value} == value, key
                assert set(row[name]) == {"city", "zip", "street"}
            elif name == "attrs":
                assert sorted(row[name]) == value, key
            else:
                assert row[name] == value, (key, name, row[name], value)
        if "coupon" not in doc:
            assert row["coupon"] is None and row["ship_to"]["street"] is None
    dlq = catalog.load_table(r1.table + "_dlq").scan().to_arrow().to_pylist()
    errors = {(d["partition"], d["offset"]): d["error"] for d in dlq}
    assert sorted(errors) == sorted(k for k, v in expected.items() if v is None)
    assert sorted(errors.values(), key=len)[0]  # each names its reason
    assert any("magic" in e for e in errors.values()) and any(
        "not in the schema registry" in e for e in errors.values()
    )
    assert any("does not decode" in e for e in errors.values())

    # DuckDB over the snapshot's Parquet files, Polars through the Iceberg metadata
    files = data_files(table)
    got_duck = duckdb.sql(
        f"select _kafka_partition, _kafka_offset, id, price, status, ship_to.city, coupon from read_parquet({files!r}, union_by_name=true) order by 1, 2"
    ).fetchall()
    assert got_duck == [
        (p, o, d["id"], d["price"], d["status"], d["ship_to"]["city"], d.get("coupon"))
        for (p, o), d in sorted(good.items())
    ]
    df = pl.scan_iceberg(table).sort("_kafka_partition", "_kafka_offset").collect()
    assert df["id"].to_list() == [d["id"] for _, d in sorted(good.items())]
    assert df["day"].to_list() == [d["day"] for _, d in sorted(good.items())]
    # a rerun finds nothing new
    [r3] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r3.status, r3.records) == ("up-to-date", 0), r3


def test_by_latest_schema_with_flatten_and_a_failing_bad_record(spark, spark_cluster, sh, catalog):
    registry = spark_cluster.controller_url
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("avrolatest")
    subject = f"{topic}-orders"
    schema = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "sensor", "type": "string"},
            {"name": "at", "type": {"type": "record", "name": "Place", "fields": [{"name": "x", "type": "double"}]}},
        ],
    }
    SchemaRegistryClient({"url": registry}).register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        configs={
            "automq.table.topic.convert.value.type": "by_latest_schema",
            "automq.table.topic.convert.value.subject": subject,
            "automq.table.topic.transform.value.type": "flatten",
        },
    )
    parsed = fastavro.parse_schema(schema)

    def body(doc: dict) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, doc)
        return buf.getvalue()

    docs = [{"sensor": f"s{i}", "at": {"x": i / 2}} for i in range(5)]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, body(d), [], 0) for d in docs])
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.offsets) == ("committed", 5, ends), r1
    df = pl.scan_iceberg(catalog.load_table(r1.table)).sort("_kafka_offset").collect()
    assert df.select("sensor", "at_x").rows() == [(d["sensor"], d["at"]["x"]) for d in docs]

    # errors.tolerance=none (the default): an undecodable value fails the run, naming it; nothing is committed
    more = sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, body(docs[0]), [], 0), (None, b"\x01", [], 0)])
    spark_cluster.wait_uploaded(topic, more)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r2.status == "failed" and f"topic {topic} partition 0 offset 6" in r2.message, r2
    assert catalog.load_table(r1.table).scan().to_arrow().num_rows == 5

    # a subject without any schema fails the run with the subject's name
    missing = sh.topic_name("avronone")
    sh.create_topic(
        spark_cluster.bootstrap, missing, configs={"automq.table.topic.convert.value.type": "by_latest_schema"}
    )
    sh.produce_confluent(spark_cluster.bootstrap, missing, [(None, body(docs[0]), [], 0)])
    [r3] = ingest(spark, location, catalog, [missing], enabled_topics=False)
    assert r3.status == "failed" and f"{missing}-value" in r3.message, r3


def test_debezium_avro_envelopes_upsert_by_id(spark, spark_cluster, sh, catalog):
    registry = spark_cluster.controller_url
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("avrodbz")
    row = {
        "type": "record",
        "name": "Value",
        "namespace": "inventory.customers",
        "fields": [{"name": "id", "type": "int"}, {"name": "email", "type": "string"}],
    }
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": "inventory.customers",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        partitions=2,
        configs={
            "automq.table.topic.convert.value.type": "by_schema_id",
            "automq.table.topic.transform.value.type": "flatten_debezium",
            "automq.table.topic.id.columns": "id",
        },
    )

    def change(op: str, before: dict | None, after: dict | None) -> dict:
        return {"before": before, "after": after, "op": op, "ts_ms": 1}

    changes = [
        (0, change("c", None, {"id": 1, "email": "a@x"})),
        (1, change("c", None, {"id": 2, "email": "b@x"})),
        (1, change("c", None, {"id": 3, "email": "c@x"})),
        (0, change("u", {"id": 1, "email": "a@x"}, {"id": 1, "email": "a2@x"})),
        (1, change("d", {"id": 2, "email": "b@x"}, None)),
    ]
    ends = _produce(spark_cluster.bootstrap, registry, topic, envelope, changes)
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r1.status == "committed", r1
    rows = sorted((r["id"], r["email"]) for r in catalog.load_table(r1.table).scan().to_arrow().to_pylist())
    assert rows == [(1, "a2@x"), (3, "c@x")]
    # a later run replaces and deletes rows written by the first
    more = _produce(
        spark_cluster.bootstrap,
        registry,
        topic,
        envelope,
        [
            (1, change("u", {"id": 3, "email": "c@x"}, {"id": 3, "email": "c2@x"})),
            (0, change("d", {"id": 1, "email": "a2@x"}, None)),
        ],
    )
    spark_cluster.wait_uploaded(topic, {p: max(ends.get(p, 0), more.get(p, 0)) for p in (0, 1)})
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r2.status == "committed", r2
    table = catalog.load_table(r1.table)
    assert [(r["id"], r["email"]) for r in table.scan().to_arrow().to_pylist()] == [(3, "c2@x")]
    assert pl.scan_iceberg(table).select("id", "email").collect().rows() == [(3, "c2@x")]


def test_by_schema_id_json_schema_values(spark, spark_cluster, sh, catalog):
    """Confluent's JSON Schema serializer writes the same wire header, then JSON text."""
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    registry = spark_cluster.controller_url
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("jsonsr")
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Reading",
        "type": "object",
        "properties": {
            "sensor": {"type": "string"},
            "value": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["sensor"],
    }
    sh.create_topic(spark_cluster.bootstrap, topic, configs={"automq.table.topic.convert.value.type": "by_schema_id"})
    sr = SchemaRegistryClient({"url": registry})
    producer = SerializingProducer(
        {"bootstrap.servers": spark_cluster.bootstrap, "value.serializer": JSONSerializer(json.dumps(schema), sr)}
    )
    docs = [{"sensor": f"s{i}", "value": i * 1.5, "tags": ["t"] * (i % 3)} for i in range(8)]
    for doc in docs:
        producer.produce(topic, value=doc, partition=0)
    assert producer.flush(60) == 0
    spark_cluster.wait_uploaded(topic, {0: len(docs)})
    [r] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r.status, r.records) == ("committed", len(docs)), r
    de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": registry}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    read = [de(v, ctx) for *_, v, _h in sh.consume_all(spark_cluster.bootstrap, topic, len(docs))]
    rows = (
        pl.scan_iceberg(catalog.load_table(r.table)).sort("_kafka_offset").select("sensor", "value", "tags").collect()
    )
    assert rows.to_dicts() == read
