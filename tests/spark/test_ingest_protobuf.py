"""Protobuf table topics through the schema registry the controller serves: records produced
by confluent-kafka's real `SerializingProducer` + `ProtobufSerializer` (message classes
compiled at test time), ingested by the Spark job (`by_schema_id`, `by_latest_schema`), the
table's rows equal to what confluent-kafka's `ProtobufDeserializer` reads back from the
broker, read through pyiceberg, DuckDB and Polars; a new schema version adds a column and a
nested field; bad records follow errors.tolerance. (The topics are not
`automq.table.topic.enable`d: other modules' runs over all enabled topics must not meet them.)"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import polars as pl
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from lake_tables import data_files, produce_serialized
from proto_messages import message_classes

from automq.spark.cluster import ClusterLocation
from automq.spark.ingest import ingest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

V1 = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  uint64 big = 2;
  optional string note = 3;
  Status status = 4;
  repeated string tags = 5;
  map<string, int32> attrs = 6;
  Address ship_to = 7;
  google.protobuf.Timestamp at = 8;
  oneof pay { string card = 9; int64 account = 10; }
  message Address { string city = 1; }
  enum Status { NEW = 0; PAID = 1; }
}
"""
# a new version: a field, and a field of the nested message
V2 = V1.replace("int64 account = 10; }", "int64 account = 10; }\n  string coupon = 11;").replace(
    "string city = 1;", "string city = 1; string street = 2;"
)


def _order(cls, i: int, v2: bool = False):
    msg = cls(id=i, big=2**64 - 1 - i, status=i % 2, tags=[f"t{j}" for j in range(i % 3)])
    if i % 3:
        msg.note = f"note {i}"
    msg.attrs.update({"n": i} if i % 2 else {})
    if i % 4:
        msg.ship_to.city = f"c{i}"
        if v2:
            msg.ship_to.street = f"s{i}"
    msg.at.seconds, msg.at.nanos = 1_700_000_000 + i, 1_000 * i
    if i % 2:
        msg.card = f"card{i}"
    else:
        msg.account = i
    if v2:
        msg.coupon = f"C{i}"
    return msg


def _produce(bootstrap: str, registry: str, topic: str, cls, msgs: list[tuple[int, object]]) -> dict[int, int]:
    return produce_serialized(bootstrap, topic, ProtobufSerializer(cls, SchemaRegistryClient({"url": registry})), msgs)


def _as_row(m) -> dict:
    """A deserialized Order as the table holds it (docs/spark.md, Protobuf values)."""
    return {
        "id": m.id,
        "big": Decimal(m.big),
        "note": m.note if m.HasField("note") else None,
        "status": type(m).Status.Name(m.status),
        "tags": list(m.tags),
        "attrs": sorted(m.attrs.items()),
        "ship_to": {"city": m.ship_to.city} if m.HasField("ship_to") else None,
        "at": dt.datetime.fromtimestamp(m.at.seconds, dt.UTC) + dt.timedelta(microseconds=m.at.nanos // 1000),
        "card": m.card if m.HasField("card") else None,
        "account": m.account if m.HasField("account") else None,
    }


def test_by_schema_id_rows_equal_what_protobuf_consumers_read_and_evolve(spark, spark_cluster, sh, catalog):
    registry = spark_cluster.controller_url
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("proto")
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        partitions=2,
        configs={"automq.table.topic.convert.value.type": "by_schema_id", "automq.table.topic.errors.tolerance": "all"},
    )
    v1 = message_classes({"shop/order.proto": V1})["shop.Order"]
    v2 = message_classes({"shop/order.proto": V2})["shop.Order"]
    ends = _produce(spark_cluster.bootstrap, registry, topic, v1, [(i % 2, _order(v1, i)) for i in range(30)])
    known_id = SchemaRegistryClient({"url": registry}).get_latest_version(f"{topic}-value").schema_id
    header = b"\x00" + known_id.to_bytes(4, "big")
    bad = [(None, b"plain text", [], 0), (None, b"\x00\x7f\xff\xff\x01\x00abc", [], 1)]
    bad += [(None, header + b"\x00\x0a\xff", [], 0), (None, header + b"\x02\x08", [], 1)]  # cut short; index 4
    sh.produce_confluent(spark_cluster.bootstrap, topic, bad)
    ends = {p: ends[p] + 2 for p in ends}
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.dead_letters, r1.offsets) == ("committed", 30, 4, ends), r1

    # version 2 adds a field and a nested field: the table widens, older rows hold nulls there
    more = _produce(spark_cluster.bootstrap, registry, topic, v2, [(i % 2, _order(v2, i, True)) for i in range(30, 36)])
    ends = {p: max(ends[p], more[p]) for p in ends}
    spark_cluster.wait_uploaded(topic, ends)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r2.status, r2.records, r2.dead_letters, r2.offsets) == ("committed", 6, 0, ends), r2

    de = ProtobufDeserializer(v2, {"use.deprecated.format": False}, SchemaRegistryClient({"url": registry}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    expected, bad_offsets = {}, set()
    for p, o, _ts, _key, value, _headers in sh.consume_all(spark_cluster.bootstrap, topic, sum(ends.values())):
        try:
            expected[(p, o)] = de(value, ctx)
        except Exception:
            bad_offsets.add((p, o))
    assert len(expected) == 36 and len(bad_offsets) == 4
    table = catalog.load_table(r1.table)
    schema = table.schema()
    assert str(schema.find_field("big").field_type) == "decimal(20, 0)"
    assert str(schema.find_field("at").field_type) == "timestamptz"
    assert str(schema.find_field("attrs").field_type) == "map<string, int>"
    got = {(r["_kafka_partition"], r["_kafka_offset"]): r for r in table.scan().to_arrow().to_pylist()}
    assert set(got) == set(expected)
    for key, m in expected.items():
        row, want = got[key], _as_row(m)
        v2_row = key in {(p, o) for (p, o) in expected if expected[(p, o)].coupon}
        for name, value in want.items():
            if name == "ship_to" and value is not None:
                assert row[name] == {**value, "street": m.ship_to.street if v2_row else None}, key
            elif name == "attrs":
                assert sorted(row[name]) == value, key
            else:
                assert row[name] == value, (key, name, row[name], value)
        assert row["coupon"] == (m.coupon if v2_row else None)
    dlq = catalog.load_table(r1.table + "_dlq").scan().to_arrow().to_pylist()
    errors = {(d["partition"], d["offset"]): d["error"] for d in dlq}
    assert set(errors) == bad_offsets
    assert any("magic" in e for e in errors.values()) and any(
        "not in the schema registry" in e for e in errors.values()
    )
    assert any("does not decode" in e for e in errors.values()) and any("name no message" in e for e in errors.values())

    files = data_files(table)
    got_duck = duckdb.sql(
        f"select _kafka_partition, _kafka_offset, id, big, status, ship_to.city, coupon from read_parquet({files!r}, union_by_name=true) order by 1, 2"
    ).fetchall()
    assert got_duck == [
        (
            p,
            o,
            m.id,
            Decimal(m.big),
            _as_row(m)["status"],
            m.ship_to.city if m.HasField("ship_to") else None,
            m.coupon or None,
        )
        for (p, o), m in sorted(expected.items())
    ]
    df = pl.scan_iceberg(table).sort("_kafka_partition", "_kafka_offset").collect()
    assert df["tags"].to_list() == [list(m.tags) for _, m in sorted(expected.items())]
    assert df["at"].to_list() == [_as_row(m)["at"] for _, m in sorted(expected.items())]


def test_by_latest_schema_bare_messages_and_a_failing_bad_record(spark, spark_cluster, sh, catalog):
    registry = spark_cluster.controller_url
    location = ClusterLocation.resolve(data_dir=spark_cluster.data_dir)
    topic = sh.topic_name("protolatest")
    # Reading is not the file's first message: the topic names it
    text = 'syntax = "proto3";\npackage m;\nmessage Place { double x = 1; }\nmessage Reading { string sensor = 1; Place at = 2; }\n'
    SchemaRegistryClient({"url": registry}).register_schema(f"{topic}-value", Schema(text, "PROTOBUF"))
    sh.create_topic(
        spark_cluster.bootstrap,
        topic,
        configs={
            "automq.table.topic.convert.value.type": "by_latest_schema",
            "automq.table.topic.transform.value.type": "flatten",
            "automq.table.topic.convert.value.message.full.name": "m.Reading",
        },
    )
    Reading = message_classes({"r.proto": text})["m.Reading"]
    msgs = [Reading(sensor=f"s{i}", at={"x": i / 2}) for i in range(5)]
    ends = sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, m.SerializeToString(), [], 0) for m in msgs])
    spark_cluster.wait_uploaded(topic, ends)
    [r1] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert (r1.status, r1.records, r1.offsets) == ("committed", 5, ends), r1
    df = pl.scan_iceberg(catalog.load_table(r1.table)).sort("_kafka_offset").collect()
    assert df.select("sensor", "at_x").rows() == [(m.sensor, m.at.x) for m in msgs]

    # errors.tolerance=none (the default): a value that does not parse fails the run, naming it
    more = sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b"\x0a\xff", [], 0)])
    spark_cluster.wait_uploaded(topic, more)
    [r2] = ingest(spark, location, catalog, [topic], enabled_topics=False)
    assert r2.status == "failed" and f"topic {topic} partition 0 offset 5" in r2.message, r2
    assert catalog.load_table(r1.table).scan().to_arrow().num_rows == 5
