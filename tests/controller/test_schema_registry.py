"""The controller's Confluent-compatible schema registry, driven by confluent-kafka's real
`SchemaRegistryClient`, `AvroSerializer` and `AvroDeserializer` (their HTTP client is
synchronous: called from a thread so the controller in this loop keeps serving), plus raw
HTTP for hostile requests. Schema ids survive a restart and a standby forwards to the leader."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from automq.broker.controller.process import ControllerService
from automq.broker.controller.schema_registry import avro

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "qty", "type": "int", "default": 1}]}
V2_NO_DEFAULT = {**V1, "fields": [*V1["fields"], {"name": "qty", "type": "int"}]}


def _avro(doc: dict) -> Schema:
    return Schema(json.dumps(doc), "AVRO")


def _client(url: str, **conf: object) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "max.retries": 0, **conf})


async def test_confluent_client_register_lookup_evolve_delete(service: ControllerService) -> None:
    sr = _client(service.url)
    call = asyncio.to_thread
    id1 = await call(sr.register_schema, "orders-value", _avro(V1))
    assert await call(sr.register_schema, "orders-value", _avro(V1)) == id1  # idempotent
    # the same schema with other whitespace and attribute order: the same id, no new version
    reordered = Schema(json.dumps(dict(reversed(list(V1.items()))), indent=2), "AVRO")
    assert await call(_client(service.url).register_schema, "orders-value", reordered) == id1
    # the same schema under another subject: the same global id
    assert await call(_client(service.url).register_schema, "other-value", _avro(V1)) == id1
    fetched = await call(_client(service.url).get_schema, id1)
    assert json.loads(fetched.schema_str) == V1 and fetched.schema_type == "AVRO"
    # BACKWARD (the default): a new field needs a default
    with pytest.raises(SchemaRegistryError) as bad:
        await call(sr.register_schema, "orders-value", _avro(V2_NO_DEFAULT))
    assert bad.value.http_status_code == 409 and bad.value.error_code == 409
    assert "qty" in bad.value.error_message
    id2 = await call(sr.register_schema, "orders-value", _avro(V2))
    assert id2 != id1
    latest = await call(sr.get_latest_version, "orders-value")
    assert (latest.schema_id, latest.version) == (id2, 2)
    assert await call(sr.get_versions, "orders-value") == [1, 2]
    assert (await call(sr.get_version, "orders-value", 1)).schema_id == id1
    found = await call(_client(service.url).lookup_schema, "orders-value", _avro(V1))
    assert (found.schema_id, found.version) == (id1, 1)
    assert sorted(await call(sr.get_subjects)) == ["orders-value", "other-value"]
    # compatibility levels
    assert await call(sr.get_compatibility) == "BACKWARD"
    assert await call(sr.set_compatibility, "orders-value", "NONE") == {"compatibility": "NONE"}
    assert await call(sr.get_compatibility, "orders-value") == "NONE"
    assert await call(sr.register_schema, "orders-value", _avro(V2_NO_DEFAULT)) > id2
    # soft delete, then permanent; ids stay readable while a version uses them
    assert await call(sr.delete_version, "orders-value", 3) == 3
    assert await call(sr.get_versions, "orders-value") == [1, 2]
    assert await call(sr.delete_subject, "other-value") == [1]
    assert await call(sr.get_subjects) == ["orders-value"]
    with pytest.raises(SchemaRegistryError) as gone:
        await call(sr.get_versions, "other-value")
    assert gone.value.error_code == 40401
    assert await call(sr.delete_subject, "other-value", True) == [1]
    assert (await call(_client(service.url).get_schema, id1)).schema_str  # orders-value v1 still uses it


async def test_avro_serializer_round_trip(service: ControllerService) -> None:
    sr = _client(service.url)
    ser = AvroSerializer(sr, json.dumps(V2))
    de = AvroDeserializer(_client(service.url))
    ctx = SerializationContext("shop", MessageField.VALUE)
    data = await asyncio.to_thread(ser, {"id": 7, "item": "pen", "qty": 3}, ctx)
    assert data[0] == 0  # Confluent wire format: magic 0, 4-byte schema id, Avro binary
    schema_id = int.from_bytes(data[1:5], "big")
    assert (await asyncio.to_thread(sr.get_latest_version, "shop-value")).schema_id == schema_id
    assert await asyncio.to_thread(de, data, ctx) == {"id": 7, "item": "pen", "qty": 3}


async def test_hostile_requests_get_confluent_errors(service: ControllerService) -> None:
    base = service.url
    async with aiohttp.ClientSession() as http:

        async def call(method: str, path: str, **kw: object) -> tuple[int, dict]:
            async with http.request(method, base + path, **kw) as resp:
                assert resp.content_type == "application/vnd.schemaregistry.v1+json", (path, resp.content_type)
                return resp.status, await resp.json(content_type=None)

        post = {"headers": {"Content-Type": "application/vnd.schemaregistry.v1+json"}}
        status, body = await call("POST", "/subjects/s/versions", data=b"{not json", **post)
        assert (status, body["error_code"]) == (400, 400)
        status, body = await call("POST", "/subjects/s/versions", data=b"[1,2]", **post)
        assert (status, body["error_code"]) == (422, 422)
        bad = json.dumps(
            {"schema": json.dumps({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})}
        )
        status, body = await call("POST", "/subjects/s/versions", data=bad, **post)
        assert (status, body["error_code"]) == (422, 42201) and "nope" in body["message"]
        status, body = await call("POST", "/subjects/s/versions", data=json.dumps({"schema": "{"}), **post)
        assert (status, body["error_code"]) == (422, 42201)
        status, body = await call(
            "POST", "/subjects/s/versions", data=json.dumps({"schema": "x", "schemaType": "PROTOBUF"}), **post
        )
        assert (status, body["error_code"]) == (422, 42201)
        status, body = await call("POST", "/subjects/s/versions", data=b"{" + b" " * (9 << 20) + b"}", **post)
        assert (status, body["error_code"]) == (413, 413)
        deep = json.dumps({"schema": "[" * 100_000 + "]" * 100_000})
        status, body = await call("POST", "/subjects/s/versions", data=deep, **post)
        assert (status, body["error_code"]) == (422, 42201)
        assert (await call("GET", "/subjects/missing/versions"))[1]["error_code"] == 40401
        assert (await call("GET", "/subjects/missing/versions/latest"))[1]["error_code"] == 40401
        assert (await call("GET", "/schemas/ids/999"))[1]["error_code"] == 40403
        assert (await call("GET", "/schemas/ids/abc"))[1]["error_code"] == 40403
        ok = json.dumps({"schema": json.dumps(V1)})
        status, body = await call("POST", "/subjects/s/versions", data=ok, **post)
        assert status == 200 and body["id"] >= 1 and body["version"] == 1
        status, body = await call("GET", "/subjects/s/versions/0")
        assert (status, body["error_code"]) == (422, 42202)
        assert (await call("GET", "/subjects/s/versions/7"))[1]["error_code"] == 40402
        status, body = await call("PUT", "/config", data=json.dumps({"compatibility": "SOMETIMES"}), **post)
        assert (status, body["error_code"]) == (422, 42203)
        assert (await call("GET", "/config/s"))[1]["error_code"] == 40408
        assert (await call("GET", "/config/s?defaultToGlobal=true"))[1] == {"compatibilityLevel": "BACKWARD"}
        assert (await call("DELETE", "/subjects/s?permanent=true"))[1]["error_code"] == 40405
        status, body = await call("GET", "/subjects/s/versions/1/nope")
        assert (status, body["error_code"]) == (404, 404)
        status, body = await call("PATCH", "/subjects")
        assert (status, body["error_code"]) == (405, 405)
        # still serving, and nothing half-made
        assert (await call("GET", "/subjects"))[1] == ["s"]
        assert (await call("GET", "/subjects/s/versions"))[1] == [1]


async def test_ids_survive_a_restart_and_a_standby_forwards(file_url: str, make_config) -> None:
    first = ControllerService(make_config(file_url, node_id=0))
    await first.start()
    await first.controller.wait_leader(10)
    id1 = await asyncio.to_thread(_client(first.url).register_schema, "a-value", _avro(V1))
    id2 = await asyncio.to_thread(_client(first.url).register_schema, "b-value", _avro(V2))
    await first.stop()
    again = ControllerService(make_config(file_url, node_id=0))
    standby = ControllerService(make_config(file_url, node_id=1, schema_registry_port=0))
    await again.start()
    await again.controller.wait_leader(10)
    await standby.start()
    try:
        while standby.controller.leader_url != again.url:  # the standby has read the election
            await asyncio.sleep(0.02)
        assert standby.schema_registry_port and standby.schema_registry_url != standby.url
        for url in (again.url, standby.url, standby.schema_registry_url):
            sr = _client(url)
            assert json.loads((await asyncio.to_thread(sr.get_schema, id1)).schema_str) == V1
            assert json.loads((await asyncio.to_thread(sr.get_schema, id2)).schema_str) == V2
        # the registry's own port serves the registry alone, not the controller API
        async with aiohttp.ClientSession() as http:
            async with http.get(standby.schema_registry_url + "/v1/status") as resp:
                assert resp.status == 404
            async with http.get(standby.url + "/v1/status") as resp:
                assert resp.status == 200
        # new ids continue after the old ones (never reused), registered through the standby
        V3 = {**V1, "name": "Other"}
        id3 = await asyncio.to_thread(_client(standby.url).register_schema, "c-value", _avro(V3))
        assert id3 > max(id1, id2)
        assert (await asyncio.to_thread(_client(again.url).get_latest_version, "c-value")).schema_id == id3
    finally:
        await standby.stop()
        await again.stop()


def test_avro_resolution_rules() -> None:
    def problem(reader: object, writer: object) -> str | None:
        return avro.incompatibility(avro.parse(json.dumps(reader)), avro.parse(json.dumps(writer)))

    assert problem("long", "int") is None and problem("double", "float") is None
    assert problem("int", "long") is not None
    assert problem("string", "bytes") is None
    assert problem(["null", "string"], "string") is None
    assert problem("string", ["null", "string"]) is not None  # the writer may hold null
    enum = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    assert problem(enum, {**enum, "symbols": ["A"]}) is None
    assert problem({**enum, "symbols": ["A"]}, enum) is not None
    assert problem({**enum, "symbols": ["A"], "default": "A"}, enum) is None
    assert problem(V1, V2) is None  # the reader ignores the writer's extra field
    assert problem(V2, V1) is None  # ... and defaults its own
    assert problem(V2_NO_DEFAULT, V1) is not None
    fixed = {"type": "fixed", "name": "F", "size": 4}
    assert problem(fixed, {**fixed, "size": 8}) is not None
    renamed = {**V1, "name": "Order2", "aliases": ["shop.Order"]}
    assert problem(renamed, V1) is None
    linked = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"], "default": None}]}
    assert problem(linked, linked) is None  # recursive types terminate
    assert avro.check_compatibility("FULL_TRANSITIVE", avro.parse(json.dumps(V2)), [avro.parse(json.dumps(V1))]) == []
    # FORWARD: old readers must read new data: adding a field is fine, removing one without a default is not
    assert (
        avro.check_compatibility("FORWARD", avro.parse(json.dumps(V2_NO_DEFAULT)), [avro.parse(json.dumps(V1))]) == []
    )
    assert avro.check_compatibility("FORWARD", avro.parse(json.dumps(V1)), [avro.parse(json.dumps(V2_NO_DEFAULT))])


async def test_the_controller_token_guards_the_registry(file_url: str, make_config, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = make_config(file_url)
    config = config.model_copy(
        update={"security": config.security.model_copy(update={"controller_token_file": str(token)})}
    )
    svc = ControllerService(config)
    await svc.start()
    await svc.controller.wait_leader(10)
    try:
        with pytest.raises(SchemaRegistryError) as refused:
            await asyncio.to_thread(_client(svc.url).register_schema, "t-value", _avro(V1))
        assert (refused.value.http_status_code, refused.value.error_code) == (401, 40101)
        bearer = {
            "bearer.auth.credentials.source": "STATIC_TOKEN",
            "bearer.auth.token": "s3cret",
            "bearer.auth.logical.cluster": "automq",
        }
        assert await asyncio.to_thread(_client(svc.url, **bearer).register_schema, "t-value", _avro(V1)) >= 1
    finally:
        await svc.stop()


def test_registry_state_survives_a_snapshot() -> None:
    from automq.broker.controller.commands import Tx
    from automq.broker.controller.schema_registry import model
    from automq.broker.controller.state import MetadataState

    st = MetadataState()
    tx = Tx(st, 0)
    v1 = model.StoredSchema("AVRO", json.dumps(V1), [])
    assert model.register(tx, "a", v1) == (1, 1)
    assert model.register(tx, "a", model.StoredSchema("AVRO", json.dumps(V2), [])) == (2, 2)
    assert model.register(tx, "b", v1) == (1, 1)
    model.set_compatibility(tx, "a", "full")
    model.delete_version(tx, "a", "1", permanent=False)
    again = MetadataState.from_snapshot(json.loads(json.dumps(st.snapshot())))
    assert again.schema_registry.snapshot() == st.schema_registry.snapshot()
    assert again.schema_registry.level("a") == "FULL" and again.schema_registry.level("b") == "BACKWARD"
    # the id counter and the "same schema, same id" index come back too
    assert model.register(Tx(again, 0), "c", v1) == (1, 1)
    assert model.register(Tx(again, 0), "d", model.StoredSchema("AVRO", '"string"', [])) == (3, 1)


async def test_json_schema_serializer_round_trip(service: ControllerService) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Point",
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x"],
    }
    ser = JSONSerializer(json.dumps(schema), _client(service.url))
    ctx = SerializationContext("points", MessageField.VALUE)
    data = await asyncio.to_thread(ser, {"x": 1.5, "y": 2}, ctx)
    schema_id = int.from_bytes(data[1:5], "big")
    stored = await asyncio.to_thread(_client(service.url).get_schema, schema_id)
    assert stored.schema_type == "JSON" and json.loads(stored.schema_str) == schema
    de = JSONDeserializer(None, schema_registry_client=_client(service.url))
    assert await asyncio.to_thread(de, data, ctx) == {"x": 1.5, "y": 2}


async def test_losing_leadership_mid_call_answers_a_retriable_error(service: ControllerService, monkeypatch) -> None:
    from automq.broker.storage.metadata import NotControllerError

    async def deposed(fn):
        raise NotControllerError("stepped down")

    monkeypatch.setattr(service.controller, "execute", deposed)
    async with aiohttp.ClientSession() as http:
        body = json.dumps({"schema": json.dumps(V1)})
        async with http.post(service.url + "/subjects/x/versions", data=body) as resp:
            assert resp.status == 503 and (await resp.json(content_type=None))["error_code"] == 50004
    monkeypatch.undo()
    assert await asyncio.to_thread(_client(service.url).register_schema, "x", _avro(V1)) >= 1
