"""Avro schemas for the registry (sans I/O): validation, the canonical text that decides
"same schema, same id", and the compatibility rules of Avro schema resolution.

`can_read(reader, writer)` is the Avro specification's resolution rule ("Schema Resolution"):
a reader schema can decode data written with the writer schema when, recursively, the types
match or are promotable (int -> long/float/double, long -> float/double, float -> double,
string <-> bytes), records' reader fields are in the writer or have a default (writer-only
fields are skipped), enums' writer symbols are all known to the reader (or the reader has a
default symbol), fixed sizes and named types' names agree (reader aliases count), and every
branch a writer union may hold is readable. BACKWARD checks can_read(new, old), FORWARD
can_read(old, new), FULL both; the *_TRANSITIVE levels against every live version, the others
against the latest one (Confluent's definitions).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, UnknownType

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


class InvalidSchema(ValueError):
    """Not a valid schema; the message says why (Confluent error 42201)."""


def canonical(text: str) -> str:
    """The schema as compact JSON with sorted keys (list order, so field order, kept): what
    registering the same schema twice compares, so whitespace and attribute order do not make
    a second id."""
    try:
        doc = json.loads(text)
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    except (ValueError, RecursionError) as exc:
        raise InvalidSchema(f"Invalid schema: not JSON: {exc}") from None


def parse(text: str, references: Sequence[str] = ()) -> Any:
    """fastavro's parsed form (names fully qualified, named types known), after the
    referenced schemas' named types. InvalidSchema naming the problem otherwise."""
    named: dict[str, Any] = {}
    try:
        for ref in references:
            fastavro.parse_schema(json.loads(ref), named_schemas=named)
        doc = json.loads(text)
        return fastavro.parse_schema(doc, named_schemas=named)
    except UnknownType as exc:
        raise InvalidSchema(f"Invalid schema: unknown type {exc.name!r}") from None
    except (SchemaParseException, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise InvalidSchema(f"Invalid schema: {exc}") from None


def _named(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict):
        return schema.get("__named_schemas", {})
    return {}


def _type_of(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"])
    return str(schema)


class _Checker:
    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self.reader_names = reader_names
        self.writer_names = writer_names
        self.seen: set[tuple[int, int]] = set()

    def resolve(self, schema: Any, names: dict[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            return names[schema]
        if isinstance(schema, dict) and schema.get("type") in PRIMITIVES:
            return schema["type"]  # {"type": "int", "logicalType": ...}: the same wire type
        return schema

    def problem(self, reader: Any, writer: Any, path: str) -> str | None:
        """None when `reader` can decode `writer`'s data, else what fails and where."""
        reader = self.resolve(reader, self.reader_names)
        writer = self.resolve(writer, self.writer_names)
        key = (id(reader), id(writer))
        if key in self.seen:  # recursive types: assume the pair holds while checking it
            return None
        rt, wt = _type_of(reader), _type_of(writer)
        if wt == "union":
            for i, branch in enumerate(writer):
                p = self.problem(reader, branch, f"{path}[{i}]")
                if p is not None:
                    return p
            return None
        if rt == "union":
            for branch in reader:
                if self.problem(branch, writer, path) is None:
                    return None
            return f"{path or '/'}: the reader's union has no branch for the writer's {wt}"
        if rt in PRIMITIVES or wt in PRIMITIVES:
            if rt == wt or rt in _PROMOTIONS.get(wt, ()):
                return None
            return f"{path or '/'}: reader type {rt} cannot read writer type {wt}"
        if rt != wt:
            return f"{path or '/'}: reader type {rt} cannot read writer type {wt}"
        if rt in ("record", "enum", "fixed") and not self._names_match(reader, writer):
            return f"{path or '/'}: reader {rt} {reader['name']} does not match writer {writer['name']}"
        self.seen.add(key)
        if rt == "array":
            return self.problem(reader["items"], writer["items"], f"{path}/items")
        if rt == "map":
            return self.problem(reader["values"], writer["values"], f"{path}/values")
        if rt == "fixed":
            if reader["size"] != writer["size"]:
                return f"{path or '/'}: fixed {reader['name']} size {reader['size']} != writer's {writer['size']}"
            return None
        if rt == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                return f"{path or '/'}: the reader's enum {reader['name']} lacks symbol(s) {missing} and has no default"
            return None
        # record
        writer_fields = {f["name"]: f for f in writer["fields"]}
        for f in reader["fields"]:
            names = [f["name"], *f.get("aliases", ())]
            match = next((writer_fields[n] for n in names if n in writer_fields), None)
            where = f"{path}/{f['name']}"
            if match is None:
                if "default" not in f:
                    return f"{where}: the reader's field has no default and the writer has no such field"
                continue
            p = self.problem(f["type"], match["type"], where)
            if p is not None:
                return p
        return None

    @staticmethod
    def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
        if reader["name"] == writer["name"]:
            return True
        # fastavro qualifies aliases like names
        return writer["name"] in reader.get("aliases", ()) or writer["name"].rsplit(".", 1)[-1] in [
            a.rsplit(".", 1)[-1] for a in reader.get("aliases", ())
        ]


def incompatibility(reader: Any, writer: Any) -> str | None:
    """Why `reader` (parsed) cannot read data written with `writer` (parsed), or None."""
    return _Checker(_named(reader), _named(writer)).problem(reader, writer, "")


def check_compatibility(
    level: str, new: Any, previous: list[Any], incompatible: Callable[[Any, Any], str | None] | None = None
) -> list[str]:
    """Problems of `new` against `previous` (oldest first) under `level`; [] when compatible.
    `incompatible(reader, writer)`: the schema type's rule (default: Avro's `incompatibility`)."""
    incompatible = incompatible or incompatibility
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    problems = []
    for i, old in enumerate(against):
        label = "an earlier version" if level.endswith("_TRANSITIVE") and i < len(against) - 1 else "the latest version"
        if level.startswith(("BACKWARD", "FULL")):
            p = incompatible(new, old)
            if p is not None:
                problems.append(f"reading data written with {label}: {p}")
        if level.startswith(("FORWARD", "FULL")):
            p = incompatible(old, new)
            if p is not None:
                problems.append(f"{label} reading data written with the new schema: {p}")
    return problems
