"""Protobuf in the controller's schema registry, driven by confluent-kafka's real
`SchemaRegistryClient`, `ProtobufSerializer` and `ProtobufDeserializer` (message classes
compiled at test time) and by raw HTTP as Java clients and curl use it (`.proto` text);
hostile descriptors; the compatibility rules."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf.internal.encoder import _VarintBytes
from proto_messages import compile_files, message_classes

from automq.broker.controller.process import ControllerService
from automq.broker.controller.schema_registry import protobuf

COMMON = """
syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 units = 2; }
"""
ORDER = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "shop/common.proto";
message Order {
  int64 id = 1;
  string item = 2;
  google.protobuf.Timestamp at = 3;
  shop.common.Money price = 4;
  map<string, int32> attrs = 5;
  message Line { string sku = 1; }
  repeated Line lines = 6;
}
message Refund { int64 order_id = 1; }
"""
POST = {"headers": {"Content-Type": "application/vnd.schemaregistry.v1+json"}}


def _client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "max.retries": 0})


def _b64(fdp) -> str:
    return base64.standard_b64encode(fdp.SerializeToString()).decode()


async def test_protobuf_serializer_round_trip_with_references(service: ControllerService) -> None:
    classes = message_classes({"shop/common.proto": COMMON, "shop/order.proto": ORDER})
    Order, Refund = classes["shop.Order"], classes["shop.Refund"]
    order = Order(id=7, item="pen", attrs={"a": 1}, lines=[Order.Line(sku="x")])
    order.at.seconds = 1_700_000_000
    order.price.currency, order.price.units = "EUR", 3
    ser = ProtobufSerializer(Order, _client(service.url), {"use.deprecated.format": False})
    ctx = SerializationContext("orders", MessageField.VALUE)
    data = await asyncio.to_thread(ser, order, ctx)
    # Confluent's wire format: magic 0, the id, the message indexes ([0]: one 0 byte), the body
    assert data[0] == 0 and data[5] == 0 and data[6:] == order.SerializeToString()
    schema_id = int.from_bytes(data[1:5], "big")
    sr = _client(service.url)
    # the import became its own subject (the serializer registers it as a reference)
    assert sorted(await asyncio.to_thread(sr.get_subjects)) == ["orders-value", "shop/common.proto"]
    text = await asyncio.to_thread(sr.get_schema, schema_id)
    assert text.schema_type == "PROTOBUF" and "message Order {" in text.schema_str  # .proto text by default
    assert [r.name for r in text.references] == ["shop/common.proto"]
    # (a new client: the client caches a schema by id whatever the format asked)
    serialized = await asyncio.to_thread(_client(service.url).get_schema, schema_id, None, "serialized")
    assert protobuf.decode(serialized.schema_str).message_type[0].name == "Order"
    de = ProtobufDeserializer(Order, {"use.deprecated.format": False}, _client(service.url))
    assert await asyncio.to_thread(de, data, ctx) == order
    # a second message of the same file: message indexes [1], the same schema id
    refunds = ProtobufSerializer(Refund, _client(service.url), {"use.deprecated.format": False})
    ctx2 = SerializationContext("refunds", MessageField.VALUE)
    data2 = await asyncio.to_thread(refunds, Refund(order_id=7), ctx2)
    assert int.from_bytes(data2[1:5], "big") == schema_id and data2[5:7] == _VarintBytes(2) + _VarintBytes(2)
    # registering the same schema again (idempotent), and as .proto text (the same schema: the same id)
    fdp = protobuf.decode(serialized.schema_str)
    refs = [SchemaReference("shop/common.proto", "shop/common.proto", 1)]
    assert await asyncio.to_thread(sr.register_schema, "orders-value", Schema(_b64(fdp), "PROTOBUF", refs)) == schema_id
    assert await asyncio.to_thread(sr.register_schema, "other", Schema(ORDER, "PROTOBUF", refs)) == schema_id
    assert await asyncio.to_thread(sr.get_versions, "orders-value") == [1]
    found = await asyncio.to_thread(sr.lookup_schema, "orders-value", Schema(ORDER, "PROTOBUF", refs))
    assert (found.schema_id, found.version) == (schema_id, 1)
    # skip.known.types=false: the serializer registers google/protobuf/timestamp.proto as a subject too
    all_refs = ProtobufSerializer(
        Order, _client(service.url), {"use.deprecated.format": False, "skip.known.types": False}
    )
    ctx3 = SerializationContext("orders3", MessageField.VALUE)
    data3 = await asyncio.to_thread(all_refs, order, ctx3)
    assert "google/protobuf/timestamp.proto" in await asyncio.to_thread(sr.get_subjects)
    assert await asyncio.to_thread(de, data3, ctx3) == order


async def test_proto_text_as_java_clients_post_it(service: ControllerService) -> None:
    async with aiohttp.ClientSession() as http:

        async def call(method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
            data = json.dumps(body) if body is not None else None
            async with http.request(method, service.url + path, data=data, **POST) as resp:
                return resp.status, await resp.json(content_type=None)

        v1 = 'syntax = "proto3";\npackage t;\nmessage Reading {\n  string sensor = 1;\n  double value = 2;\n}\n'
        status, body = await call("POST", "/subjects/r-value/versions", {"schema": v1, "schemaType": "PROTOBUF"})
        assert status == 200 and body["schema"] == v1, body  # answered in the form posted
        id1 = body["id"]
        status, got = await call("GET", f"/schemas/ids/{id1}")
        assert got["schemaType"] == "PROTOBUF" and "double value = 2;" in got["schema"]
        status, got = await call("GET", "/subjects/r-value/versions/latest?format=serialized")
        assert protobuf.decode(got["schema"]).message_type[0].field[1].name == "value"
        # the rendered text compiles to the same descriptor, so it registers as the same schema
        status, again = await call(
            "POST", "/subjects/r-value/versions", {"schema": got["schema"], "schemaType": "PROTOBUF"}
        )
        assert (status, again["id"], again["version"]) == (200, id1, 1)
        # BACKWARD: a field number reused with another type is refused, a new field is fine
        retyped = v1.replace("double value = 2;", "string value = 2;")
        status, body = await call("POST", "/subjects/r-value/versions", {"schema": retyped, "schemaType": "PROTOBUF"})
        assert (status, body["error_code"]) == (409, 409) and "t.Reading.value" in body["message"], body
        v2 = v1.replace("double value = 2;", "double value = 2;\n  int64 at = 3;")
        status, body = await call("POST", "/subjects/r-value/versions", {"schema": v2, "schemaType": "PROTOBUF"})
        assert status == 200 and body["version"] == 2
        status, body = await call(
            "POST",
            "/compatibility/subjects/r-value/versions/latest?verbose=true",
            {"schema": 'syntax = "proto3";\npackage t;\nmessage Other { int32 a = 1; }', "schemaType": "PROTOBUF"},
        )
        assert body["is_compatible"] is False and "t.Reading: message removed" in body["messages"][0]
        status, types = await call("GET", "/schemas/types")
        assert "PROTOBUF" in types


async def test_hostile_protobuf_schemas_get_42201(service: ControllerService) -> None:
    [wkt, good] = compile_files(
        {
            "g.proto": 'syntax = "proto3";\nimport "google/protobuf/duration.proto";\nmessage G { google.protobuf.Duration d = 1; }'
        }
    )
    deep = b"\x0a\x01M"
    for _ in range(500):  # messages nested 500 deep: beyond the decoder's depth limit
        deep = b"\x0a\x01M\x1a" + _VarintBytes(len(deep)) + deep
    deep = b"\x22" + _VarintBytes(len(deep)) + deep
    fields = " ".join(f"int64 f{i} = {i + 1};" for i in range(20))
    huge = "syntax = 'proto3'; " + " ".join(f"message A{m} {{ {fields} }}" for m in range(2_000))  # 40,000 fields
    bad_import = good.__class__()
    bad_import.CopyFrom(good)
    bad_import.dependency[0] = "not/there.proto"
    cases = {
        "not base64, not .proto": "%%%% not a schema",
        "invalid base64": "QUJD=",
        "truncated descriptor": _b64(good)[:-8],
        "nested too deep": base64.b64encode(deep).decode(),
        "syntax error": 'syntax = "proto3"; message A { int32 a = 1 }',
        "unknown type": 'syntax = "proto3"; message A { Nope a = 1; }',
        "unknown import": _b64(bad_import),
        "unresolved reference": 'syntax = "proto3"; import "x.proto"; message A { X a = 1; }',
        "deep text": "syntax = 'proto3'; " + "message A { " * 300 + "}" * 300,
    }
    async with aiohttp.ClientSession() as http:
        for what, schema in cases.items():
            body = json.dumps({"schema": schema, "schemaType": "PROTOBUF"})
            async with http.post(service.url + "/subjects/h/versions", data=body, **POST) as resp:
                answer = await resp.json(content_type=None)
                assert (resp.status, answer["error_code"]) == (422, 42201), (what, answer)
                assert answer["message"].startswith("Invalid schema"), (what, answer)
        # a large but valid one is accepted, and the controller keeps serving
        body = json.dumps({"schema": huge, "schemaType": "PROTOBUF"})
        async with http.post(service.url + "/subjects/h/versions", data=body, **POST) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(service.url + "/subjects") as resp:
            assert await resp.json(content_type=None) == ["h"]
    assert wkt.name == "google/protobuf/duration.proto"


def _fdp(text: str):
    [fdp] = [f for f in compile_files({"s.proto": text}) if f.name == "s.proto"]
    return fdp


def test_protobuf_compatibility_rules() -> None:
    base = 'syntax = "proto3";\npackage p;\nmessage M {\n  int32 a = 1;\n  string s = 2;\n  N n = 3;\n}\nmessage N { int32 x = 1; }\n'
    old = _fdp(base)

    def problem(new_text: str, reader_new: bool = True) -> str | None:
        new = _fdp(new_text)
        return protobuf.incompatibility(new, old) if reader_new else protobuf.incompatibility(old, new)

    assert problem(base.replace("N n = 3;", "N n = 3;\n  bool added = 4;")) is None  # a field added
    assert problem(base.replace("  string s = 2;\n", "")) is None  # a field removed (its number unused)
    assert problem(base.replace("int32 a = 1;", "int64 a = 1;")) is None  # varint kinds read each other
    assert "type int32 changed to string" in problem(base.replace("int32 a = 1;", "string a = 1;"))
    assert problem(base.replace("string s = 2;", "bytes s = 2;")) is None
    assert "changed between repeated and singular" in problem(base.replace("int32 a = 1;", "repeated int32 a = 1;"))
    assert "changed to .p.M" in problem(base.replace("N n = 3;", "M n = 3;"))
    assert "p.N: message removed" in problem(base.replace("message N { int32 x = 1; }", "").replace("N n = 3;", ""))
    assert problem(base + "message Extra { int32 e = 1; }") is None  # a message added: BACKWARD fine
    assert "p.Extra: message removed" in problem(base + "message Extra { int32 e = 1; }", reader_new=False)
    two_into_oneof = base.replace(
        "int32 a = 1;\n  string s = 2;", "oneof o {\n    int32 a = 1;\n    string s = 2;\n  }"
    )
    assert "moved into the new oneof o" in problem(two_into_oneof)
    one_into_oneof = base.replace("int32 a = 1;", "oneof o {\n    int32 a = 1;\n  }")
    assert problem(one_into_oneof) is None
    proto2 = 'syntax = "proto2";\npackage p;\nmessage M { optional int32 a = 1; }\n'
    old = _fdp(proto2)
    assert "required field added" in problem(proto2.replace("}", " required int32 r = 2; }"))
    assert "syntax" in protobuf.incompatibility(_fdp(base), old)


def test_protobuf_schemas_survive_a_snapshot_in_their_canonical_form() -> None:
    from automq.broker.controller.commands import Tx
    from automq.broker.controller.schema_registry import model
    from automq.broker.controller.state import MetadataState

    fdp = _fdp('syntax = "proto3";\npackage p;\nmessage M { int32 some_field = 1; }\n')
    assert fdp.message_type[0].field[0].json_name == "someField"  # protoc's default, which the canonical form drops
    st = MetadataState()
    assert model.register(Tx(st, 0), "a", model.StoredSchema("PROTOBUF", _b64(fdp), [])) == (1, 1)
    stored = st.schema_registry.schemas[1].schema
    assert stored == protobuf.canonical(_b64(fdp)) and not protobuf.decode(stored).message_type[0].field[0].json_name
    again = MetadataState.from_snapshot(json.loads(json.dumps(st.snapshot())))
    assert again.schema_registry.snapshot() == st.schema_registry.snapshot()
    # the descriptor as another client sends it (another file name, json names given): the same id
    renamed = fdp.__class__()
    renamed.CopyFrom(fdp)
    renamed.name = "elsewhere/m.proto"
    assert model.register(Tx(again, 0), "b", model.StoredSchema("PROTOBUF", _b64(renamed), [])) == (1, 1)
