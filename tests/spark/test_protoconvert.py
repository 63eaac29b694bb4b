"""Protobuf values without Spark: the Protobuf -> Arrow type mapping, presence, message
indexes, and decode() telling bad records apart (the registry's answers stubbed at
avroconvert's `_request`; the real registry is exercised by tests/spark/test_ingest_protobuf.py
and tests/controller/test_schema_registry_protobuf.py). Messages are written by classes
compiled at test time."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from proto_messages import compile_files, message_classes

from automq.spark import avroconvert, protoconvert

TYPES = """
syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/empty.proto";
message All {
  int32 i32 = 1; sint32 s32 = 2; sfixed32 sf32 = 3;
  int64 i64 = 4; sint64 s64 = 5; sfixed64 sf64 = 6;
  uint32 u32 = 7; fixed32 f32 = 8; uint64 u64 = 9; fixed64 f64 = 10;
  float fl = 11; double db = 12; bool ok = 13; string s = 14; bytes b = 15;
  Color color = 16;
  optional string maybe = 17;
  Inner inner = 18;
  repeated Inner inners = 19;
  repeated int32 nums = 20;
  map<string, Inner> by_name = 21;
  map<int64, Color> colors = 22;
  oneof choice { string text = 23; int64 number = 24; }
  google.protobuf.Timestamp at = 25;
  google.protobuf.Int64Value wrapped = 26;
  google.protobuf.StringValue label = 27;
  google.protobuf.Empty nothing = 28;
  message Inner { string name = 1; repeated Color tags = 2; }
}
enum Color { RED = 0; GREEN = 1; }
message Node { string v = 1; Node next = 2; }
"""


@pytest.fixture(scope="module")
def schema() -> tuple[protoconvert.ProtoSchema, dict]:
    files = {"t.proto": TYPES}
    [fdp] = [f for f in compile_files(files) if f.name == "t.proto"]
    serialized = base64.b64encode(fdp.SerializeToString()).decode()
    return protoconvert.build(9, serialized), message_classes(files)


def test_types_map_to_arrow_and_values_to_rows(schema) -> None:
    parsed, classes = schema
    All = classes["t.All"]
    reader = parsed.reader((0,))
    t = reader.arrow
    assert t is not None
    types = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
    assert types["i32"] == types["s32"] == types["sf32"] == pa.int32()
    assert types["i64"] == types["s64"] == types["sf64"] == types["u32"] == types["f32"] == pa.int64()
    assert types["u64"] == types["f64"] == pa.decimal128(20, 0)
    assert (types["fl"], types["db"], types["ok"], types["s"], types["b"]) == (
        pa.float32(),
        pa.float64(),
        pa.bool_(),
        pa.string(),
        pa.binary(),
    )
    assert types["color"] == pa.string() and types["maybe"] == pa.string()
    assert types["inner"] == pa.struct([("name", pa.string()), ("tags", pa.list_(pa.string()))])
    assert types["inners"] == pa.list_(types["inner"]) and types["nums"] == pa.list_(pa.int32())
    assert types["by_name"] == pa.map_(pa.string(), types["inner"])
    assert types["colors"] == pa.map_(pa.int64(), pa.string())
    assert types["at"] == pa.timestamp("us", tz="UTC")
    assert (types["wrapped"], types["label"]) == (pa.int64(), pa.string())
    assert "nothing" not in types  # google.protobuf.Empty holds nothing to store

    msg = All(i32=-1, s32=-2, sf32=-3, i64=-(2**40), u32=2**32 - 1, u64=2**64 - 1, fl=0.5, s="é", b=b"\x00")
    msg.color = 1
    msg.inner.name = "in"
    msg.inner.tags.extend([1, 0])
    msg.inners.add(name="a")
    msg.nums.extend([1, 2])
    msg.by_name["k"].name = "v"
    msg.colors[5] = 1
    msg.number = 42
    msg.at.seconds, msg.at.nanos = 1_700_000_000, 123_456_789
    msg.wrapped.value = 0  # set to the default: still present, unlike a plain scalar
    body = b"\x00" + msg.SerializeToString()  # message indexes [0]
    row, message, problem = protoconvert.read(parsed, body, framed=True)
    assert problem == "" and message is not None and message.arrow == t and message.name == "t.All"
    table = pa.Table.from_struct_array(pa.array([row], type=t)).to_pylist()[0]
    assert table["i32"] == -1 and table["s32"] == -2 and table["sf32"] == -3 and table["i64"] == -(2**40)
    assert table["u32"] == 2**32 - 1 and table["u64"] == Decimal(2**64 - 1)
    assert table["f64"] == 0 and table["db"] == 0.0 and table["ok"] is False  # proto3 defaults, not nulls
    assert (table["s"], table["b"], table["color"]) == ("é", b"\x00", "GREEN")
    assert table["maybe"] is None  # proto3 optional, not set
    assert table["inner"] == {"name": "in", "tags": ["GREEN", "RED"]}
    assert table["inners"] == [{"name": "a", "tags": []}] and table["nums"] == [1, 2]
    assert table["by_name"] == [("k", {"name": "v", "tags": []})] and table["colors"] == [(5, "GREEN")]
    assert (table["text"], table["number"]) == (None, 42)  # oneof: the member not set is null
    assert table["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC)
    assert (table["wrapped"], table["label"]) == (0, None)
    # an enum number the schema does not name keeps its number
    odd = All()
    odd.color = 7
    row, _, _ = protoconvert.read(parsed, b"\x00" + odd.SerializeToString(), framed=True)
    assert row["color"] == "7" and row["inner"] is None and row["at"] is None


def test_message_indexes_recursion_and_bad_bodies(schema) -> None:
    parsed, classes = schema
    assert protoconvert.message_indexes(b"\x00rest") == ((0,), 1)
    # count 2 (zigzag 4): [0, 2] = All.Inner (its map entries ByNameEntry, ColorsEntry come first)
    two = _VarintBytes(4) + _VarintBytes(0) + _VarintBytes(4)
    assert protoconvert.message_indexes(two) == ((0, 2), 3)
    inner = classes["t.All.Inner"](name="x")
    row, _, problem = protoconvert.read(parsed, two + inner.SerializeToString(), framed=True)
    assert (row, problem) == ({"name": "x", "tags": []}, "")
    # the second top-level message is recursive: no table representation
    node = classes["t.Node"](v="a")
    _, _, problem = protoconvert.read(parsed, _VarintBytes(2) + _VarintBytes(2) + node.SerializeToString(), framed=True)
    assert "recursive message t.Node" in problem
    _, _, problem = protoconvert.read(parsed, _VarintBytes(2) + _VarintBytes(14) + b"", framed=True)
    assert "name no message" in problem
    _, _, problem = protoconvert.read(parsed, b"\x00\x0a\x05ab", framed=True)  # a string field cut short
    assert "does not decode" in problem
    _, _, problem = protoconvert.read(parsed, b"\x80", framed=True)
    assert "truncated message indexes" in problem
    # by_latest_schema: a bare message, the first one unless named
    row, _, problem = protoconvert.read(parsed, inner.SerializeToString(), framed=False, message="t.All.Inner")
    assert (row, problem) == ({"name": "x", "tags": []}, "")
    _, _, problem = protoconvert.read(parsed, b"", framed=False, message="t.Missing")
    assert "t.Missing is not in schema" in problem


def test_decode_dispatches_by_schema_type_and_tells_bad_records_apart(schema, monkeypatch) -> None:
    v1 = 'syntax = "proto3";\npackage e;\nmessage R { int32 id = 1; }\n'  # v2 widens id to int64
    v2 = 'syntax = "proto3";\npackage e;\nmessage R { int64 id = 1; string added = 2; }\n'
    serialized, classes = {}, {}
    for schema_id, text in ((1, v1), (2, v2)):
        [fdp] = compile_files({"e.proto": text})
        serialized[schema_id] = base64.b64encode(fdp.SerializeToString()).decode()
        classes[schema_id] = message_classes({"e.proto": text})["e.R"]
    asked: list[str] = []

    def request(urls: str, path: str, query: str = "") -> dict:
        asked.append(path + query)
        schema_id = int(path.rsplit("/", 1)[-1])
        if schema_id not in serialized:
            raise avroconvert.UnknownSchema("not found")
        return {"schemaType": "PROTOBUF", "schema": serialized[schema_id] if query else "syntax = ..."}

    monkeypatch.setattr(avroconvert, "_request", request)
    monkeypatch.setattr(avroconvert, "_CACHE", {})
    monkeypatch.setattr(avroconvert, "_UNKNOWN", set())

    def wire(schema_id: int, msg) -> bytes:
        return b"\x00" + schema_id.to_bytes(4, "big") + b"\x00" + msg.SerializeToString()

    values = [
        wire(1, classes[1](id=1)),
        wire(2, classes[2](id=2, added="x")),
        None,
        b"\x01junk",
        wire(3, classes[1](id=3)),
        wire(1, classes[1](id=4))[:-1] + b"\xff",
    ]
    decoded = avroconvert.decode(values, "http://registry", None)
    assert decoded.good == [True, True, True, False, False, False]
    assert decoded.fields.to_pylist() == [
        {"id": 1, "added": None},
        {"id": 2, "added": "x"},
        {"id": None, "added": None},
    ]
    assert decoded.fields.schema.field("id").type == pa.int64()  # the two versions' types, unified
    assert "magic" in decoded.errors[0] and "not in the schema registry" in decoded.errors[1]
    assert "does not decode" in decoded.errors[2]
    assert "/schemas/ids/1?format=serialized" in asked and asked.count("/schemas/ids/1") == 1


def test_the_message_name_topic_config() -> None:
    from automq.broker import topic_configs as tc
    from automq.spark.convert import TableSettings

    key = "automq.table.topic.convert.value.message.full.name"
    assert TableSettings.from_topic_configs({key: ".shop.v1.Order"}).value_message == "shop.v1.Order"
    assert TableSettings.from_topic_configs({}).value_message == ""
    with pytest.raises(tc.TopicConfigError, match="full name"):
        TableSettings.from_topic_configs({key: "shop..Order"})
