"""avroconvert without Spark: Avro -> Arrow types, bad records, two schema versions in one
batch, and the registry cache (the registry's HTTP answers stubbed at `_request`; the real
registry is exercised by tests/spark/test_ingest_avro.py and tests/controller)."""

from __future__ import annotations

import io
import json

import fastavro
import pyarrow as pa
import pytest

from automq.spark import avroconvert

V1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
V2 = {
    "type": "record",
    "name": "R",
    "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": ""}],
}
MULTI = {"type": "record", "name": "M", "fields": [{"name": "u", "type": ["int", "string"]}]}
LINKED = {"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]}
POINT = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "x": {"type": ["number", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "at": {"$ref": "#/definitions/Place"},
    },
    "definitions": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
SCHEMAS = {1: V1, 2: V2, 3: MULTI, 4: LINKED, 5: POINT}
JSON_IDS = {5}


@pytest.fixture
def registry(monkeypatch) -> list[str]:
    calls: list[str] = []

    def request(urls: str, path: str) -> dict:
        calls.append(path)
        schema_id = int(path.rsplit("/", 1)[-1])
        if schema_id not in SCHEMAS:
            raise avroconvert.UnknownSchema("not found")
        body = {"schema": json.dumps(SCHEMAS[schema_id])}
        return {**body, "schemaType": "JSON"} if schema_id in JSON_IDS else body

    monkeypatch.setattr(avroconvert, "_request", request)
    monkeypatch.setattr(avroconvert, "_CACHE", {})
    monkeypatch.setattr(avroconvert, "_UNKNOWN", set())
    return calls


def wire(schema_id: int, doc: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(SCHEMAS[schema_id]), doc)
    return buf.getvalue()


def test_two_versions_in_one_batch_become_one_table(registry) -> None:
    values = [wire(1, {"a": 1}), None, wire(2, {"a": 2**40, "b": "x"}), wire(1, {"a": 3})]
    out = avroconvert.decode(values, "http://r", None)
    assert out.good == [True] * 4 and out.errors == []
    assert out.fields.schema == pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.string())])
    assert out.fields.to_pylist() == [
        {"a": 1, "b": None},
        {"a": None, "b": None},
        {"a": 2**40, "b": "x"},
        {"a": 3, "b": None},
    ]
    assert sorted(registry) == ["/schemas/ids/1", "/schemas/ids/2"]  # once per id


def test_bad_records_are_told_apart(registry) -> None:
    values = [
        b"no header",
        b"\x00\x00\x00\x00\x63" + b"\x02",  # id 99: unknown
        b"\x00\x00\x00\x00\x63" + b"\x02",  # again: not asked twice
        wire(1, {"a": 1}) + b"extra",
        wire(1, {"a": 1})[:5],  # no body
        b"\x00\x00\x00\x00\x03\x00\x02",  # a union of two non-null types
        b"\x00\x00\x00\x00\x04\x00",  # a recursive record
        wire(1, {"a": 5}),
    ]
    out = avroconvert.decode(values, "http://r", None)
    assert out.good == [False] * 7 + [True]
    assert out.fields.to_pylist() == [{"a": 5}]
    assert "magic" in out.errors[0]
    assert "not in the schema registry" in out.errors[1] and "not in the schema registry" in out.errors[2]
    assert registry.count("/schemas/ids/99") == 1
    assert "bytes left over" in out.errors[3] and "does not decode" in out.errors[4]
    assert "union" in out.errors[5] and "recursive" in out.errors[6]


def test_latest_schema_bodies_have_no_header(registry) -> None:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(V2), {"a": 7, "b": "y"})
    out = avroconvert.decode([buf.getvalue(), b"\x01"], "http://r", 2)
    assert out.good == [True, False] and out.fields.to_pylist() == [{"a": 7, "b": "y"}]


def test_logical_and_complex_types_map_to_arrow() -> None:
    doc = {
        "type": "record",
        "name": "T",
        "namespace": "n",
        "fields": [
            {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}},
            {
                "name": "f",
                "type": {"type": "fixed", "name": "F", "size": 16, "logicalType": "decimal", "precision": 20},
            },
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
            {"name": "e2", "type": "E"},
            {"name": "m", "type": {"type": "map", "values": ["null", "double"]}},
            {"name": "l", "type": {"type": "array", "items": "n.E"}},
            {"name": "raw", "type": {"type": "fixed", "name": "Raw", "size": 3}},
        ],
    }
    assert avroconvert.to_arrow(doc, {}) == pa.struct(
        [
            ("d", pa.decimal128(10, 3)),
            ("f", pa.decimal128(20, 0)),
            ("day", pa.date32()),
            ("t", pa.time64("us")),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("local", pa.timestamp("us")),
            ("id", pa.string()),
            ("e", pa.string()),
            ("e2", pa.string()),
            ("m", pa.map_(pa.string(), pa.float64())),
            ("l", pa.list_(pa.string())),
            ("raw", pa.binary(3)),
        ]
    )
    with pytest.raises(avroconvert.UnsupportedSchema, match="38"):
        avroconvert.to_arrow({"type": "bytes", "logicalType": "decimal", "precision": 40}, {})


def test_json_schema_values(registry) -> None:
    """Confluent's JSON Schema serializer: the wire header, then JSON text."""

    def jwire(doc: object) -> bytes:
        return b"\x00" + (5).to_bytes(4, "big") + json.dumps(doc).encode()

    values = [
        jwire({"id": 1, "x": 2, "tags": ["a"], "at": {"city": "c"}, "undeclared": True}),
        jwire({"id": "one"}),  # a string for an integer
        b"\x00\x00\x00\x00\x05{not json",
        jwire([1, 2]),  # not an object
        jwire({"id": 2}),
        wire(1, {"a": 9}),  # an Avro id in the same batch
    ]
    out = avroconvert.decode(values, "http://r", None)
    assert out.good == [True, False, False, False, True, True]
    assert "column types" in out.errors[0] and "not JSON" in out.errors[1] and "not the object" in out.errors[2]
    assert out.fields.to_pylist() == [
        {"id": 1, "x": 2.0, "tags": ["a"], "at": {"city": "c"}, "a": None},
        {"id": 2, "x": None, "tags": None, "at": None, "a": None},
        {"id": None, "x": None, "tags": None, "at": None, "a": 9},
    ]
    from automq.spark import jsonschematypes

    for unsupported in (True, {"type": "object"}, {"type": ["string", "integer"]}, {"$ref": "#"}):
        with pytest.raises(jsonschematypes.UnsupportedSchema):
            jsonschematypes.to_arrow(unsupported)
