"""JSON Schema compatibility: the rules of `jsonschema_compat` in both directions, a hypothesis
property over generated object schemas, hostile `$ref` graphs, and the levels end to end
through a real ControllerService with confluent-kafka's `SchemaRegistryClient` (409 on
register, `test_compatibility`, `?verbose=true` messages)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import aiohttp
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from hypothesis import given, settings
from hypothesis import strategies as st

from automq.broker.controller.process import ControllerService
from automq.broker.controller.schema_registry import avro, model
from automq.broker.controller.schema_registry.jsonschema_compat import MAX_DEPTH, incompatibilities

STRING = {"type": "string"}
INTEGER = {"type": "integer"}


def obj(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **extra}


def backward(new: Any, old: Any) -> list[str]:
    """BACKWARD: the new schema reads what the old one wrote."""
    return incompatibilities(new, old)


def forward(new: Any, old: Any) -> list[str]:
    return incompatibilities(old, new)


# ---------------------------------------------------------------------------- the rules


def test_types_and_the_integer_number_widening() -> None:
    assert not backward({"type": "number"}, INTEGER)  # an integer is a number
    assert forward({"type": "number"}, INTEGER)  # old readers of integers get 1.5
    assert backward(STRING, INTEGER) and forward(STRING, INTEGER)
    assert not backward({"type": ["string", "null"]}, STRING)
    assert backward(STRING, {"type": ["string", "null"]})
    assert backward(STRING, {})  # the writer allowed anything
    assert not backward(True, STRING) and backward(False, STRING) and not backward(STRING, False)


def test_properties_under_open_and_closed_content_models() -> None:
    v1 = obj({"name": STRING})
    added = obj({"name": STRING, "age": INTEGER})
    # open (the default): old data may hold "age" of any type
    assert any("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL" in p for p in backward(added, v1))
    assert not forward(added, v1)
    assert not backward(v1, added)  # removing from an open model: the reader allows anything there
    # closed: old data has no "age" at all
    closed, closed_added = (
        {**v1, "additionalProperties": False},
        {**added, "additionalProperties": False},
    )
    assert not backward(closed_added, closed)
    assert any("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL" in p for p in forward(closed_added, closed))
    # partially open: what the writer allowed under the new name must fit the reader's schema
    partial = {**v1, "additionalProperties": INTEGER}
    assert not backward({**added, "additionalProperties": INTEGER}, partial)
    assert backward(obj({"name": STRING, "age": STRING}, additionalProperties=INTEGER), partial)
    # closing an open model breaks old data; opening a closed one does not
    assert backward(closed, v1) and not backward(v1, closed)
    # a property both have is checked recursively
    assert backward(obj({"name": INTEGER}), v1)


def test_required() -> None:
    v1 = obj({"a": STRING, "b": STRING}, required=["a"])
    assert backward({**v1, "required": ["a", "b"]}, v1)  # old data may lack "b"
    assert not forward({**v1, "required": ["a", "b"]}, v1)
    assert not backward({**v1, "required": []}, v1)
    with_default = obj({"a": STRING, "b": {**STRING, "default": ""}}, required=["a", "b"])
    assert not backward(with_default, v1)  # Confluent: a required property with a default is compatible


def test_enum_and_const() -> None:
    colours = {"enum": ["red", "green"]}
    assert not backward({"enum": ["red", "green", "blue"]}, colours)
    assert backward({"enum": ["red"]}, colours) and forward({"enum": ["red", "green", "blue"]}, colours)
    assert backward({"enum": [1, 0]}, {"enum": [True, False]})  # JSON's true is not 1
    assert backward(colours, STRING) and not backward(STRING, colours)
    assert not backward({"enum": ["a", "b"]}, {"const": "a"}) and backward({"const": "b"}, {"const": "a"})


@pytest.mark.parametrize(
    ("keyword", "loose", "tight", "type_"),
    [
        ("maxLength", 10, 5, "string"),
        ("minLength", 1, 3, "string"),
        ("maximum", 100, 10, "number"),
        ("minimum", 0, 5, "number"),
        ("exclusiveMaximum", 100, 10, "number"),
        ("maxItems", 9, 3, "array"),
        ("minItems", 0, 2, "array"),
        ("maxProperties", 9, 3, "object"),
    ],
)
def test_bounds_loosened_tightened_added_removed(keyword: str, loose: int, tight: int, type_: str) -> None:
    old = {"type": type_, keyword: tight}
    new = {"type": type_, keyword: loose}
    assert not backward(new, old) and forward(new, old)
    assert not backward({"type": type_}, old)  # removed: looser
    assert backward(old, {"type": type_})  # added: tighter


def test_exclusive_bounds_multiple_of_and_pattern() -> None:
    assert backward({"type": "number", "exclusiveMaximum": 10}, {"type": "number", "maximum": 10})
    assert not backward({"type": "number", "maximum": 10}, {"type": "number", "exclusiveMaximum": 10})
    assert not backward({"type": "number", "multipleOf": 2}, {"type": "number", "multipleOf": 4})
    assert backward({"type": "number", "multipleOf": 4}, {"type": "number", "multipleOf": 2})
    assert not backward({"type": "number", "multipleOf": 0.1}, {"type": "number", "multipleOf": 0.5})
    assert backward({"type": "string", "pattern": "^a"}, STRING)
    assert backward({"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "^b"})
    assert not backward(STRING, {"type": "string", "pattern": "^a"})
    # keywords of a type the writer never writes do not matter
    assert not backward({"type": "integer", "maxLength": 1}, INTEGER)


def test_items_list_and_tuple_forms() -> None:
    ints, numbers = {"type": "array", "items": INTEGER}, {"type": "array", "items": {"type": "number"}}
    assert not backward(numbers, ints) and backward(ints, numbers)
    pair = {"type": "array", "items": [STRING, INTEGER], "additionalItems": False}
    assert not backward({"type": "array", "items": [STRING, INTEGER]}, pair)  # the rest opened
    assert backward({"type": "array", "items": [STRING, STRING]}, pair)
    assert backward({**pair, "items": [STRING, INTEGER, STRING]}, {"type": "array", "items": [STRING, INTEGER]})
    assert not backward({"type": "array", "items": {"type": ["string", "integer"]}}, pair)
    # 2020-12's prefixItems reads the same
    assert not backward(
        {"type": "array", "prefixItems": [STRING], "items": False},
        {"type": "array", "items": [STRING], "additionalItems": False},
    )
    assert backward({"type": "array", "prefixItems": [INTEGER]}, {"type": "array", "prefixItems": [STRING]})


def test_combined_schemas() -> None:
    either = {"oneOf": [STRING, INTEGER]}
    assert not backward({"oneOf": [STRING, INTEGER, {"type": "null"}]}, either)  # branch added
    assert backward({"oneOf": [STRING]}, either)  # branch removed
    assert not backward(either, STRING) and backward(STRING, either)  # a plain schema becomes a oneOf
    assert not backward({"anyOf": [STRING, {"type": "number"}]}, {"anyOf": [STRING, INTEGER]})
    base = obj({"a": STRING})
    both = {"allOf": [base, {"required": ["a"]}]}
    assert not backward(base, both)  # a conjunct dropped: looser
    assert backward(both, base)  # a conjunct added: tighter
    assert backward({"not": {"type": "null"}}, {}) and not backward({}, {"not": {"type": "null"}})
    assert not backward({"not": STRING}, {"not": {"type": ["string", "integer"]}})
    assert backward({"not": {"type": ["string", "integer"]}}, {"not": STRING})


def test_dependencies() -> None:
    old = obj({"card": STRING, "billing": STRING}, dependencies={"card": ["billing"]})
    assert not backward({**old, "dependencies": {}}, old)
    assert backward({**old, "dependentRequired": {"billing": ["card"]}, "dependencies": {}}, old)


def test_local_refs_resolve_and_recursion_terminates() -> None:
    def tree(leaf: dict[str, Any], defs: str = "definitions") -> dict[str, Any]:
        node = obj({"value": leaf, "children": {"type": "array", "items": {"$ref": f"#/{defs}/node"}}})
        return {"$ref": f"#/{defs}/node", defs: {"node": node}}

    assert not backward(tree({"type": "number"}), tree(INTEGER, "$defs"))
    found = backward(tree(INTEGER, "$defs"), tree({"type": "number"}))
    assert found and "value" in found[0]
    assert backward({"$ref": "#/definitions/missing"}, STRING)
    assert not backward({"$ref": "other.json"}, {"$ref": "other.json", "title": "x"})


def test_hostile_schemas_are_reported_not_hung() -> None:
    cycle = {
        "$ref": "#/definitions/a",
        "definitions": {"a": {"$ref": "#/definitions/b"}, "b": {"$ref": "#/definitions/a"}},
    }
    assert "cycle" in backward(cycle, STRING)[0]

    def nested(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
        schema = leaf
        for _ in range(depth):
            schema = {"type": "array", "items": schema}
        return schema

    assert not backward(nested(MAX_DEPTH // 2, {"type": "number"}), nested(MAX_DEPTH // 2, INTEGER))
    deep = backward(nested(MAX_DEPTH * 10, {"type": "number"}), nested(MAX_DEPTH * 10, INTEGER))
    assert "too complex to check" in deep[0]
    # two references a level, sixty levels: 2**60 paths, bounded by the step limit
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}}]}
        for i in range(60)
    }
    bomb = {"$ref": "#/$defs/d0", "$defs": {**defs, "d60": INTEGER}}
    other = copy.deepcopy(bomb)
    other["$defs"]["d60"] = {"type": "number"}
    assert backward(bomb, other)


# ---------------------------------------------------------------------------- properties

_leaf = st.sampled_from([STRING, INTEGER, {"type": "number"}, {"type": "boolean"}, {"enum": ["a", "b"]}])
_names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
_schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda props, closed, req: {
                "type": "object",
                "properties": props,
                **({"additionalProperties": False} if closed else {}),
                "required": sorted(props)[:req],
            },
            st.dictionaries(_names, inner, max_size=4),
            st.booleans(),
            st.integers(0, 2),
        ),
        st.builds(lambda items: {"type": "array", "items": items}, inner),
        st.builds(lambda a, b: {"oneOf": [a, b]}, inner, inner),
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_schemas)
def test_a_schema_is_compatible_with_itself(schema: dict[str, Any]) -> None:
    # a copy with an annotation: not the same object nor equal, so the whole walk runs
    other = {**copy.deepcopy(schema), "description": "v2"}
    assert incompatibilities(other, schema) == []
    assert incompatibilities(schema, other) == []


@settings(max_examples=150, deadline=None)
@given(_schemas, _names, _leaf)
def test_adding_an_optional_property(schema: dict[str, Any], name: str, prop: dict[str, Any]) -> None:
    base = obj({"x": schema})
    closed = {**base, "additionalProperties": False}
    assert incompatibilities({**closed, "properties": {"x": schema, "new" + name: prop}}, closed) == []
    assert incompatibilities({**base, "properties": {"x": schema, "new" + name: prop}}, base) != []
    assert incompatibilities({**base, "properties": {"x": schema, "new" + name: {}}}, base) == []


_WORDS = [
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties", "items",
    "additionalItems", "prefixItems", "oneOf", "anyOf", "allOf", "not", "$ref", "maximum", "exclusiveMaximum",
    "minLength", "multipleOf", "pattern", "dependencies", "dependentRequired", "definitions", "if",
]  # fmt: skip
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from([*_WORDS, "#", "a"]), inner, max_size=4)
    ),
    max_leaves=20,
)
_hostile = st.dictionaries(st.sampled_from(_WORDS), _json_values, max_size=5) | _json_values


@settings(max_examples=300, deadline=None)
@given(_hostile, _hostile)
def test_any_json_values_get_an_answer_not_an_exception(reader: Any, writer: Any) -> None:
    found = incompatibilities(reader, writer)
    assert isinstance(found, list) and all(isinstance(p, str) for p in found)


# ---------------------------------------------------------------------------- end to end


def _json(doc: dict[str, Any]) -> Schema:
    return Schema(json.dumps(doc), "JSON")


def _client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "max.retries": 0})


async def test_the_registry_refuses_a_backward_incompatible_json_schema(service: ControllerService) -> None:
    call = asyncio.to_thread
    sr = _client(service.url)
    v1 = obj({"id": INTEGER, "name": STRING}, required=["id"], additionalProperties=False)
    breaking = {**v1, "properties": {"id": STRING, "name": STRING}}  # id: integer -> string
    evolved = {**v1, "properties": {**v1["properties"], "note": STRING}}  # optional, closed model
    id1 = await call(sr.register_schema, "users-value", _json(v1))
    assert await call(sr.test_compatibility, "users-value", _json(breaking)) is False
    assert await call(sr.test_compatibility, "users-value", _json(evolved)) is True
    with pytest.raises(SchemaRegistryError) as refused:
        await call(sr.register_schema, "users-value", _json(breaking))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert "incompatible with an earlier schema" in refused.value.error_message
    assert "/properties/id" in refused.value.error_message
    id2 = await call(sr.register_schema, "users-value", _json(evolved))
    assert id2 != id1 and await call(sr.get_versions, "users-value") == [1, 2]
    # verbose messages, against version 1 and the latest
    async with aiohttp.ClientSession() as http:
        body = json.dumps({"schema": json.dumps(breaking), "schemaType": "JSON"})
        for version in ("1", "latest"):
            url = f"{service.url}/compatibility/subjects/users-value/versions/{version}?verbose=true"
            async with http.post(url, data=body) as resp:
                answer = await resp.json(content_type=None)
            assert answer["is_compatible"] is False and "type" in answer["messages"][0], answer
    # FORWARD: old readers of the closed model reject the new property; BACKWARD_TRANSITIVE
    # and NONE as levels for the same subject
    await call(sr.set_compatibility, "users-value", "FORWARD")
    more = {**v1, "properties": {**evolved["properties"], "extra": STRING}}
    with pytest.raises(SchemaRegistryError) as forward_refused:
        await call(sr.register_schema, "users-value", _json(more))
    assert forward_refused.value.error_code == 409 and "CLOSED_CONTENT_MODEL" in forward_refused.value.error_message
    await call(sr.set_compatibility, "users-value", "BACKWARD_TRANSITIVE")
    assert await call(sr.register_schema, "users-value", _json(more)) > id2
    await call(sr.set_compatibility, "users-value", "NONE")
    assert await call(sr.register_schema, "users-value", _json(breaking)) > id2


def test_every_level_applies_the_json_rule() -> None:
    old = model.StoredSchema("JSON", json.dumps(obj({"n": INTEGER}, additionalProperties=False)), [])
    widened = obj({"n": {"type": "number"}}, additionalProperties=False)
    new = model.StoredSchema("JSON", json.dumps(widened), [])
    refused = {"FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}
    for level in avro.COMPATIBILITY_LEVELS:
        found = model.problems(model.RegistryState(), level, new, widened, [old])
        assert bool(found) is (level in refused), (level, found)


async def test_hostile_json_schemas_get_an_answer_and_the_controller_keeps_serving(service: ControllerService) -> None:
    call = asyncio.to_thread
    sr = _client(service.url)
    cycle = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
    await call(sr.register_schema, "cycle-value", _json(cycle))
    with pytest.raises(SchemaRegistryError) as refused:
        await call(sr.register_schema, "cycle-value", _json({**cycle, "title": "v2"}))
    assert refused.value.error_code == 409 and "cycle" in refused.value.error_message
    deep: dict[str, Any] = INTEGER
    for _ in range(900):
        deep = {"type": "array", "items": deep}
    await call(sr.register_schema, "deep-value", _json(deep))
    assert await call(sr.test_compatibility, "deep-value", _json({**deep, "title": "v2"})) is False
    assert await call(sr.get_subjects) == ["cycle-value", "deep-value"]
