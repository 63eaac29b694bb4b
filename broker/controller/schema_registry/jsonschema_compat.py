"""JSON Schema compatibility for the registry (sans I/O): can a reader schema accept every
document a writer schema accepts?

JSON Schema constrains documents rather than describing an encoding, so "the reader can read
the writer's data" means: every document valid under the writer is valid under the reader
(the reader is as loose or looser). This is Confluent's rule too. BACKWARD checks
`incompatibilities(new, old)`, FORWARD `(old, new)`, FULL both, through
`avro.check_compatibility` like the other schema types.

The check walks both documents keyword by keyword (not by sampling data), so it is
conservative where exact set inclusion is out of reach (regular expressions, `if`/`then`/
`else`, `not` against other keywords): it then reports a problem rather than pass a change
it cannot prove. The rules, with Confluent's names for the differences where there is one:

- `type`: the reader must allow every type the writer allows; `integer` is a `number`, so a
  writer `integer` read as `number` is fine and the reverse is not (TYPE_NARROWED/CHANGED).
- `enum`/`const`: the reader's values must include the writer's (ENUM_ARRAY_NARROWED).
- bounds (`maximum`, `exclusiveMaximum`, `minimum`, `exclusiveMinimum`, `maxLength`,
  `minLength`, `maxItems`, `minItems`, `maxProperties`, `minProperties`): a reader bound
  needs a writer bound at least as tight (..._ADDED, ..._DECREASED, ..._INCREASED);
  `multipleOf`: the writer's must be a multiple of the reader's; `pattern`, `uniqueItems`,
  `contains`, `if`/`then`/`else`: a reader's must be the writer's too.
- objects: a property both have is checked recursively; a property only the reader has is
  checked against what the writer allows under that name: nothing when the writer is closed
  (`additionalProperties: false`: adding an optional property is fine), anything when it is
  open (the default: PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL), its `additionalProperties`
  schema when partially open; a property only the writer has must be allowed by the reader's
  `additionalProperties` (PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL). A property the reader
  requires must be required by the writer, unless the reader gives it a `default`
  (Confluent's REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED). `patternProperties` are matched by
  their pattern text; a property added or removed is also checked against every pattern's
  schema (no regular expression is run, so such a change may be refused where the patterns
  would allow it). `dependencies`/`dependentRequired`/`dependentSchemas`: a reader's
  dependency must be implied by the writer's.
- arrays: `items` in the list form and tuple form (`items` as a list with
  `additionalItems`, or `prefixItems` with `items`) are compared position by position, the
  positions past a tuple falling to its rest schema.
- `oneOf`/`anyOf`: every branch of the writer must be accepted by some branch of the reader
  (adding a branch is fine, removing one is not; a plain schema becoming a `oneOf` that
  includes it is fine); `allOf`: the writer's conjuncts are merged, and each of the reader's
  must accept the writer. `not`: the reader's `not` must exclude no more than the writer's.
- `$ref` to the document itself (`#`, `#/definitions/...`, `#/$defs/...`, any JSON pointer)
  is resolved (a `$ref` replaces its siblings, as in draft-07); recursive schemas terminate
  (a pair of subschemas already under comparison is assumed compatible). Other `$ref`s
  cannot be resolved (JSON schema references are refused at registration): the same URI on
  both sides counts as the same schema, a different one as a problem.

Hostile documents: at most `MAX_DEPTH` nested comparisons and `MAX_STEPS` in all (long lists
and serialised values count too, each value once however many `$ref`s reach it); a pair
beyond either is reported incompatible ("too complex to check") rather than hang the
controller. Annotations (`title`, `description`, `default`, `examples`, `format`, `$comment`)
are not compared.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from fractions import Fraction
from typing import Any

MAX_DEPTH = 100
MAX_STEPS = 50_000  # about 0.6 s of one core at worst; a schema of 50,000 nodes still checks
MAX_REF_HOPS = 32
ALL_TYPES = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "format",
        "definitions",
        "$defs",
        "readOnly",
        "writeOnly",
        "deprecated",
        "contentMediaType",
        "contentEncoding",
    }
)


_TOO_COMPLEX = (
    f"the schemas are too complex to check (more than {MAX_DEPTH} nested levels or {MAX_STEPS} "
    "comparisons); reported incompatible"
)


class Uncheckable(Exception):
    """The pair is too deep or too large to compare; the message says which."""


def incompatibilities(reader: Any, writer: Any) -> list[str]:
    """Why `reader` (a JSON schema document) does not accept every document `writer`
    accepts; [] when it does. Never raises for any JSON value."""
    try:
        if _value_key(reader) == _value_key(writer):  # not ==: in Python, True == 1
            return []
        return _Checker(reader, writer).check(reader, writer, "#", 0)
    except Uncheckable as exc:
        return [str(exc)]
    except RecursionError:
        return ["#: the schemas are too complex to check (nested too deeply); reported incompatible"]


def incompatibility(reader: Any, writer: Any) -> str | None:
    """The rule `avro.check_compatibility` applies: all problems in one message, or None."""
    found = incompatibilities(reader, writer)
    return "; ".join(found) if found else None


def _value_key(value: Any) -> str:
    """Equality of JSON values as JSON means it (True is not 1, key order does not count)."""
    return json.dumps(value, sort_keys=True)


def _type_of_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _enum(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    values = schema.get("enum")
    return values if isinstance(values, list) else None


def _number(value: Any) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    except (ValueError, OverflowError):
        return None


def _upper(schema: dict[str, Any]) -> tuple[Fraction, bool] | None:
    """The tightest upper bound (value, exclusive), draft-04's boolean form included."""
    return _bound(schema, "maximum", "exclusiveMaximum", min)


def _lower(schema: dict[str, Any]) -> tuple[Fraction, bool] | None:
    return _bound(schema, "minimum", "exclusiveMinimum", max)


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, tighter: Any) -> tuple[Fraction, bool] | None:
    found: list[tuple[Fraction, bool]] = []
    value = _number(schema.get(inclusive))
    if value is not None:
        found.append((value, schema.get(exclusive) is True))
    other = _number(schema.get(exclusive))
    if other is not None:
        found.append((other, True))
    if not found:
        return None
    best = tighter(v for v, _ in found)
    return best, any(ex for v, ex in found if v == best)


def _dict_of(schema: dict[str, Any], word: str) -> dict[str, Any]:
    value = schema.get(word)
    return value if isinstance(value, dict) else {}


def _list_of(schema: dict[str, Any], word: str) -> list[Any]:
    value = schema.get(word)
    return value if isinstance(value, list) else []


def _merge(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """A schema whose documents include every document valid under both (properties and
    required united, other keywords from `part`): a safe stand-in for their conjunction
    when it is the writer."""
    merged = {**base, **part}
    if isinstance(base.get("properties"), dict) and isinstance(part.get("properties"), dict):
        merged["properties"] = {**base["properties"], **part["properties"]}
    if isinstance(base.get("required"), list) and isinstance(part.get("required"), list):
        merged["required"] = list(dict.fromkeys([*base["required"], *part["required"]]))
    return merged


class _Checker:
    def __init__(self, reader_root: Any, writer_root: Any) -> None:
        self.roots = {"reader": reader_root, "writer": writer_root}
        # pairs under comparison, kept alive so that their ids are not reused by other objects
        self.assumed: dict[tuple[int, int], tuple[Any, Any]] = {}
        self.steps = 0
        # (id, kind) -> (object, what was computed from it): a subschema reached through many
        # $refs costs its serialisation once; the object is kept so that its id stays its own
        self.memo: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def spend(self, cost: int, path: str) -> None:
        """Count work besides the comparisons themselves (long lists, serialising values)."""
        self.steps += cost // 64
        if self.steps > MAX_STEPS:
            raise Uncheckable(f"{path}: {_TOO_COMPLEX}")

    def _memo(self, kind: str, objects: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """`compute()` once per `objects` (by identity) and kind; what it costs, it spends."""
        memo_key = (kind, *map(id, objects))
        found = self.memo.get(memo_key)
        if found is None:
            found = (objects, compute())
            self.memo[memo_key] = found
        return found[1]

    def key(self, value: Any, path: str) -> str:
        """`value` as canonical JSON, the form JSON equality compares."""

        def compute() -> str:
            text = _value_key(value)
            self.spend(len(text), path)
            return text

        found: str = self._memo("key", (value,), compute)
        return found

    def missing(self, reader_values: list[Any], writer_values: list[Any], path: str) -> list[Any]:
        """The writer's enum values the reader's enum lacks."""

        def compute() -> list[Any]:
            self.spend(len(reader_values) + len(writer_values), path)
            allowed = {self.key(v, path) for v in reader_values}
            return [v for v in writer_values if self.key(v, path) not in allowed]

        found: list[Any] = self._memo("missing", (reader_values, writer_values), compute)
        return found

    def types(self, schema: dict[str, Any], path: str) -> frozenset[str] | None:
        """The types `schema` allows by `type`, `enum` or `const`; None when unconstrained."""
        declared = schema.get("type")
        if isinstance(declared, str):
            return frozenset({declared})
        if isinstance(declared, list):
            return frozenset(t for t in declared if isinstance(t, str))
        values = _enum(schema)
        if values is None:
            return None

        def compute() -> frozenset[str]:
            self.spend(len(values), path)
            return frozenset(_type_of_value(v) for v in values)

        found: frozenset[str] = self._memo("types", (values,), compute)
        return found

    # ------------------------------------------------------------------ $ref

    def resolve(self, schema: Any, side: str, path: str) -> Any:
        """`schema` with local `$ref`s followed; a non-local one is kept as {"$ref": uri}."""
        for _ in range(MAX_REF_HOPS):
            if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
                return schema
            ref: str = schema["$ref"]
            if not ref.startswith("#"):
                return {"$ref": ref}
            target = self.roots[side]
            for token in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
                token = token.replace("~1", "/").replace("~0", "~")
                if isinstance(target, dict) and token in target:
                    target = target[token]
                elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                    target = target[int(token)]
                else:
                    raise Uncheckable(f"{path}: the {side}'s $ref {ref} does not resolve within the schema")
            schema = target
        raise Uncheckable(f"{path}: the {side}'s $ref chain is longer than {MAX_REF_HOPS} (or a cycle)")

    # ------------------------------------------------------------------ the walk

    def check(self, reader: Any, writer: Any, path: str, depth: int) -> list[str]:
        self.steps += 1
        if depth > MAX_DEPTH or self.steps > MAX_STEPS:
            raise Uncheckable(f"{path}: {_TOO_COMPLEX}")
        reader = self.resolve(reader, "reader", path)
        writer = self.resolve(writer, "writer", path)
        if writer is False or reader is True or writer is reader:
            return []
        if reader is False:
            return [f"{path}: the reader accepts nothing (false) where the writer accepts documents"]
        if writer is True:
            writer = {}
        if not isinstance(reader, dict) or not isinstance(writer, dict):
            return [f"{path}: not a schema (an object or a boolean)"]
        key = (id(reader), id(writer))
        if key in self.assumed:  # recursive schemas: the pair holds unless proven otherwise
            return []
        self.assumed[key] = (reader, writer)
        found = self._check(reader, writer, path, depth + 1)
        if found:
            del self.assumed[key]
        return found

    def _check(self, reader: dict[str, Any], writer: dict[str, Any], path: str, depth: int) -> list[str]:
        if "$ref" in reader or "$ref" in writer:  # non-local: the same URI is the same schema
            if reader.get("$ref") == writer.get("$ref"):
                return []
            return [f"{path}: $ref {writer.get('$ref')} changed to {reader.get('$ref')} (not resolvable here)"]
        # the writer's alternatives first: each must be acceptable on its own
        for word in ("anyOf", "oneOf"):
            branches = writer.get(word)
            if isinstance(branches, list):
                base = {k: v for k, v in writer.items() if k != word}
                found: list[str] = []
                for i, branch in enumerate(branches):
                    branch = self.resolve(branch, "writer", path)
                    if branch is False:
                        continue
                    part = _merge(base, branch) if isinstance(branch, dict) else base
                    found += self.check(reader, part, f"{path}/{word}/{i}", depth)
                return found
        conjuncts = writer.get("allOf")
        if isinstance(conjuncts, list):
            merged = {k: v for k, v in writer.items() if k != "allOf"}
            for part in conjuncts:
                part = self.resolve(part, "writer", path)
                if part is False:
                    return []
                if isinstance(part, dict):
                    merged = _merge(merged, part)
            return self.check(reader, merged, path, depth)
        conjuncts = reader.get("allOf")
        if isinstance(conjuncts, list):
            base = {k: v for k, v in reader.items() if k != "allOf"}
            found = self.check(base, writer, path, depth)
            for i, part in enumerate(conjuncts):
                found += self.check(part, writer, f"{path}/allOf/{i}", depth)
            return found
        for word in ("anyOf", "oneOf"):
            branches = reader.get(word)
            if isinstance(branches, list):
                base = {k: v for k, v in reader.items() if k != word}
                for branch in branches:
                    branch = self.resolve(branch, "reader", path)
                    part = _merge(base, branch) if isinstance(branch, dict) else branch
                    if part is True or (part is not False and not self.check(part, writer, path, depth)):
                        return []
                return [f"{path}: no branch of the reader's {word} accepts the writer's schema ({word} narrowed)"]
        return self._keywords(reader, writer, path, depth)

    def _keywords(self, reader: dict[str, Any], writer: dict[str, Any], path: str, depth: int) -> list[str]:
        found: list[str] = []
        rtypes, wtypes = self.types(reader, path), self.types(writer, path)
        written = wtypes if wtypes is not None else ALL_TYPES
        if rtypes is not None:
            lost = sorted(t for t in written if t not in rtypes and not (t == "integer" and "number" in rtypes))
            if lost:
                found.append(f"{path}: type {sorted(rtypes)} does not accept the writer's {lost} (type narrowed)")
        renum, wenum = _enum(reader), _enum(writer)
        if renum is not None:
            if wenum is None:
                found.append(f"{path}: enum added: the writer allows values outside {renum}")
            else:
                missing = self.missing(renum, wenum, path)
                if missing:
                    found.append(f"{path}: enum narrowed: the reader lacks {missing}")
        found += self._same(reader, writer, path, ("if", "then", "else"))
        if "not" in reader:
            if "not" not in writer:
                found.append(f"{path}: not added")
            else:
                found += self._not(reader["not"], writer["not"], path, depth)
        if written & {"integer", "number"}:
            found += self._numbers(reader, writer, path)
        if "string" in written:
            found += self._limits(reader, writer, path, "maxLength", "minLength")
            found += self._same(reader, writer, path, ("pattern",))
        if "array" in written:
            found += self._limits(reader, writer, path, "maxItems", "minItems")
            found += self._same(reader, writer, path, ("uniqueItems", "contains"))
            found += self._items(reader, writer, path, depth)
        if "object" in written:
            found += self._limits(reader, writer, path, "maxProperties", "minProperties")
            found += self._same(reader, writer, path, ("propertyNames",))
            found += self._objects(reader, writer, path, depth)
        return found

    def _same(self, reader: dict[str, Any], writer: dict[str, Any], path: str, words: tuple[str, ...]) -> list[str]:
        """Keywords compared by value alone: a reader's must be the writer's too."""
        found = []
        for word in words:
            if word not in reader or (word == "uniqueItems" and reader[word] is False):
                continue
            if word not in writer or self.key(reader[word], path) != self.key(writer[word], path):
                found.append(f"{path}: {word} added or changed (the reader's {word} is not the writer's)")
        return found

    def _not(self, reader_not: Any, writer_not: Any, path: str, depth: int) -> list[str]:
        """The reader excludes no more than the writer: the writer's excluded schema accepts
        all the reader's (roots swapped, so that each side's $refs resolve in its document)."""
        flipped = _Checker(self.roots["writer"], self.roots["reader"])
        flipped.steps = self.steps
        try:
            return [
                f"{path}/not: the reader excludes more: {p}" for p in flipped.check(writer_not, reader_not, path, depth)
            ]
        finally:
            self.steps = flipped.steps

    @staticmethod
    def _numbers(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
        found = []
        for name, bound, looser in (("maximum", _upper, 1), ("minimum", _lower, -1)):
            rb, wb = bound(reader), bound(writer)
            if rb is None:
                continue
            if wb is None:
                found.append(f"{path}: {name} {rb[0]} added")
            elif (wb[0] - rb[0]) * looser > 0 or (wb[0] == rb[0] and rb[1] and not wb[1]):
                found.append(f"{path}: {name} tightened from {wb[0]} to {rb[0]}")
        rm, wm = _number(reader.get("multipleOf")), _number(writer.get("multipleOf"))
        if rm is not None and rm > 0:
            if wm is None:
                found.append(f"{path}: multipleOf {rm} added")
            elif (wm / rm).denominator != 1:
                found.append(f"{path}: multipleOf changed from {wm} to {rm} (not a divisor)")
        return found

    @staticmethod
    def _limits(reader: dict[str, Any], writer: dict[str, Any], path: str, most: str, least: str) -> list[str]:
        found = []
        for name, sign in ((most, 1), (least, -1)):
            rv, wv = _number(reader.get(name)), _number(writer.get(name))
            if rv is None:
                continue
            if wv is None:
                found.append(f"{path}: {name} {rv} added")
            elif (wv - rv) * sign > 0:
                found.append(f"{path}: {name} tightened from {wv} to {rv}")
        return found

    @staticmethod
    def _tuple(schema: dict[str, Any]) -> tuple[list[Any], Any]:
        """(positional item schemas, schema of the items after them)."""
        if isinstance(schema.get("prefixItems"), list):
            return schema["prefixItems"], schema.get("items", True)
        items = schema.get("items", True)
        if isinstance(items, list):
            return items, schema.get("additionalItems", True)
        return [], items

    def _items(self, reader: dict[str, Any], writer: dict[str, Any], path: str, depth: int) -> list[str]:
        rprefix, rrest = self._tuple(reader)
        wprefix, wrest = self._tuple(writer)
        found = []
        for i in range(max(len(rprefix), len(wprefix))):
            r = rprefix[i] if i < len(rprefix) else rrest
            w = wprefix[i] if i < len(wprefix) else wrest
            found += self.check(r, w, f"{path}/items/{i}", depth)
        return found + self.check(rrest, wrest, f"{path}/items", depth)

    def _objects(self, reader: dict[str, Any], writer: dict[str, Any], path: str, depth: int) -> list[str]:
        rprops = _dict_of(reader, "properties")
        wprops = _dict_of(writer, "properties")
        rpatterns = _dict_of(reader, "patternProperties")
        wpatterns = _dict_of(writer, "patternProperties")
        self.spend(len(rprops) + len(wprops), path)
        radd, wadd = reader.get("additionalProperties", True), writer.get("additionalProperties", True)
        found: list[str] = []
        for name, rschema in rprops.items():
            where = f"{path}/properties/{name}"
            if name in wprops:
                found += self.check(rschema, wprops[name], where, depth)
                continue
            # the writer may still write `name`: under a pattern or as an additional property
            for pattern, wschema in wpatterns.items():
                found += self.check(rschema, wschema, f"{where} (writer's pattern {pattern})", depth)
            problems = self.check(rschema, wadd, where, depth)
            if problems and self.resolve(wadd, "writer", path) is True:
                found.append(f"{where}: property added to an open content model (PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL)")
            else:
                found += problems
        for name, wschema in wprops.items():
            if name in rprops:
                continue
            where = f"{path}/properties/{name}"
            for pattern, rschema in rpatterns.items():
                found += self.check(rschema, wschema, f"{where} (reader's pattern {pattern})", depth)
            problems = self.check(radd, wschema, where, depth)
            if problems and self.resolve(radd, "reader", path) is False:
                found.append(
                    f"{where}: property removed from a closed content model "
                    "(PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL)"
                )
            else:
                found += problems
        for pattern, rschema in rpatterns.items():
            found += self.check(rschema, wpatterns.get(pattern, wadd), f"{path}/patternProperties/{pattern}", depth)
        for pattern, wschema in wpatterns.items():
            if pattern not in rpatterns:
                found += self.check(radd, wschema, f"{path}/patternProperties/{pattern}", depth)
        problems = self.check(radd, wadd, f"{path}/additionalProperties", depth)
        if problems and self.resolve(radd, "reader", path) is False:
            found.append(f"{path}: additionalProperties false added (the content model closed)")
        else:
            found += problems
        found += self._required(reader, writer, rprops, path)
        return found + self._dependencies(reader, writer, path, depth)

    def _required(self, reader: dict[str, Any], writer: dict[str, Any], rprops: dict[str, Any], path: str) -> list[str]:
        rreq = _list_of(reader, "required")
        wreq = {name for name in _list_of(writer, "required") if isinstance(name, str)}
        self.spend(len(rreq) + len(wreq), path)
        found = []
        for name in rreq:
            if not isinstance(name, str) or name in wreq:
                continue
            prop = rprops.get(name) if isinstance(name, str) else None
            if isinstance(prop, dict) and "default" in prop:
                continue  # Confluent: REQUIRED_ATTRIBUTE_WITH_DEFAULT_ADDED is compatible
            found.append(f"{path}/required: property {name!r} required by the reader, optional for the writer")
        return found

    def _dependencies(self, reader: dict[str, Any], writer: dict[str, Any], path: str, depth: int) -> list[str]:
        def split(schema: dict[str, Any]) -> tuple[dict[str, list[Any]], dict[str, Any]]:
            names: dict[str, list[Any]] = {}
            schemas: dict[str, Any] = {}
            for word in ("dependencies", "dependentRequired", "dependentSchemas"):
                deps = schema.get(word)
                if isinstance(deps, dict):
                    for k, v in deps.items():
                        if isinstance(v, list):
                            names[k] = names.get(k, []) + v
                        else:
                            schemas[k] = v
            return names, schemas

        rnames, rschemas = split(reader)
        wnames, wschemas = split(writer)
        self.spend(sum(map(len, rnames.values())) + sum(map(len, wnames.values())), path)
        found = []
        for k, needed in rnames.items():
            implied = {n for n in wnames.get(k, []) if isinstance(n, str)}
            missing = [n for n in needed if isinstance(n, str) and n not in implied]
            if missing:
                found.append(f"{path}/dependencies/{k}: the reader also needs {missing} (dependency added or extended)")
        for k, rschema in rschemas.items():
            if k not in wschemas:
                found.append(f"{path}/dependencies/{k}: dependency schema added")
            else:
                found += self.check(rschema, wschemas[k], f"{path}/dependencies/{k}", depth)
        return found
