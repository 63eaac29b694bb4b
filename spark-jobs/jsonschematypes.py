"""JSON Schema -> Arrow types, for `by_schema_id` values written by Confluent's JSON Schema
serializer (the wire header, then JSON text): an object's declared `properties` become the
columns (a property the schema does not declare is not a column), `string` -> string,
`integer` -> int64, `number` -> double, `boolean` -> boolean, `array` -> list of `items`,
nested objects -> structs, `["null", T]` types and `oneOf`/`anyOf` of null and one schema ->
nullable T, local `$ref`s (`#/definitions/...`, `#/$defs/...`) are followed. What has no single
column type (free-form objects without properties, unions of several types, recursive
`$ref`s, `true` schemas) raises UnsupportedSchema: its records are bad records."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

_SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
MAX_DEPTH = 64


class UnsupportedSchema(Exception):
    pass


def to_arrow(doc: Any, root: Any = None, refs: tuple[str, ...] = (), depth: int = 0) -> pa.DataType:
    root = doc if root is None else root
    if depth > MAX_DEPTH:
        raise UnsupportedSchema(f"nested deeper than {MAX_DEPTH}")
    if not isinstance(doc, dict):
        raise UnsupportedSchema(f"{doc!r} admits any value: no column type")
    if "$ref" in doc:
        ref = doc["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise UnsupportedSchema(f"$ref {ref!r}: only local references (#/...) are followed")
        if ref in refs:
            raise UnsupportedSchema(f"recursive $ref {ref} has no table representation")
        target: Any = root
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise UnsupportedSchema(f"$ref {ref} points nowhere")
            target = target[part]
        return to_arrow(target, root, (*refs, ref), depth + 1)
    for key in ("oneOf", "anyOf"):
        if key in doc:
            options = [o for o in doc[key] if not (isinstance(o, dict) and o.get("type") == "null")]
            if len(options) != 1:
                raise UnsupportedSchema(f"{key} of several schemas has no single column type")
            return to_arrow(options[0], root, refs, depth + 1)
    kind = doc.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise UnsupportedSchema(f"type {kind} has no single column type")
        kind = kinds[0]
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return pa.list_(to_arrow(doc.get("items"), root, refs, depth + 1))
    if kind == "object" or (kind is None and "properties" in doc):
        props = doc.get("properties")
        if not isinstance(props, dict) or not props:
            raise UnsupportedSchema("an object without declared properties has no columns")
        return pa.struct([pa.field(str(name), to_arrow(p, root, refs, depth + 1)) for name, p in props.items()])
    raise UnsupportedSchema(f"type {kind!r} has no column type")
