"""The schema registry's state and commands (sans I/O), part of the controller's metadata.

Schemas, subjects and compatibility levels live in the controller's metadata log like every
other fact, so a schema id is assigned once, by the active controller, and survives restarts
and failover (a standby rebuilds the same state from the log and its snapshots). Commands
validate against the state before they emit a record (`records.SchemaRegistered`, ...), as
`commands.py` does; `RegistryError` carries Confluent's HTTP status and error code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from automq.broker.controller import records as r
from automq.broker.controller.schema_registry import avro, jsonschema_compat, protobuf
from automq.broker.storage.metadata import MetadataError

if TYPE_CHECKING:
    from automq.broker.controller.commands import Tx

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
# each schema type's rule: why a reader cannot read a writer's data (parsed schemas), or None
INCOMPATIBILITY = {
    "AVRO": avro.incompatibility,
    "JSON": jsonschema_compat.incompatibility,
    "PROTOBUF": protobuf.incompatibility,
}
DEFAULT_COMPATIBILITY = "BACKWARD"
MAX_VERSION = 2**31 - 1
MAX_REFERENCE_DEPTH = 32


class RegistryError(MetadataError):
    """A Confluent Schema Registry error: HTTP status, error code, message."""

    code = "SCHEMA_REGISTRY_ERROR"

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found.")


def schema_not_found(what: str = "Schema not found") -> RegistryError:
    return RegistryError(404, 40403, what)


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, 42201, message)


def invalid_version(version: object) -> RegistryError:
    return RegistryError(
        422,
        42202,
        f"The specified version '{version}' is not a valid version id. Allowed values are between "
        f'[1, {MAX_VERSION}] and the string "latest"',
    )


def invalid_compatibility(level: object) -> RegistryError:
    return RegistryError(
        422, 42203, f"Invalid compatibility level {level!r}; one of {', '.join(avro.COMPATIBILITY_LEVELS)}"
    )


@dataclass(slots=True)
class StoredSchema:
    schema_type: str
    schema: str
    references: list[dict[str, Any]]


@dataclass(slots=True)
class SubjectVersion:
    version: int
    schema_id: int
    deleted: bool = False


@dataclass
class RegistryState:
    schemas: dict[int, StoredSchema] = field(default_factory=dict)
    subjects: dict[str, dict[int, SubjectVersion]] = field(default_factory=dict)
    next_id: int = 1
    global_compatibility: str | None = None
    compatibility: dict[str, str] = field(default_factory=dict)
    # derived: (type, canonical text, references) -> id
    ids: dict[tuple[str, str, str], int] = field(default_factory=dict)

    # ------------------------------------------------------------------ apply

    def apply(self, rec: r.Record) -> None:
        if isinstance(rec, r.SchemaRegistered):
            if rec.schema_id not in self.schemas:
                stored = StoredSchema(rec.schema_type, rec.schema, list(rec.references))
                self.schemas[rec.schema_id] = stored
                self.ids[fingerprint(stored)] = rec.schema_id
                self.next_id = max(self.next_id, rec.schema_id + 1)
            self.subjects.setdefault(rec.subject, {})[rec.version] = SubjectVersion(rec.version, rec.schema_id)
        elif isinstance(rec, r.SchemaVersionDeleted):
            versions = self.subjects.get(rec.subject, {})
            if rec.permanent:
                versions.pop(rec.version, None)
                if not versions:
                    self.subjects.pop(rec.subject, None)
            elif rec.version in versions:
                versions[rec.version].deleted = True
        elif isinstance(rec, r.SchemaConfigSet):
            if rec.subject is None:
                self.global_compatibility = rec.compatibility
            elif rec.compatibility is None:
                self.compatibility.pop(rec.subject, None)
            else:
                self.compatibility[rec.subject] = rec.compatibility

    # ------------------------------------------------------------------ snapshot

    def snapshot(self) -> dict[str, Any]:
        return {
            "schemas": [[i, s.schema_type, s.schema, s.references] for i, s in self.schemas.items()],
            "subjects": {
                n: [[v.version, v.schema_id, v.deleted] for v in vs.values()] for n, vs in self.subjects.items()
            },
            "next_id": self.next_id,
            "global_compatibility": self.global_compatibility,
            "compatibility": dict(self.compatibility),
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> RegistryState:
        st = cls(next_id=data["next_id"], global_compatibility=data["global_compatibility"])
        for schema_id, schema_type, text, refs in data["schemas"]:
            stored = StoredSchema(schema_type, text, refs)
            st.schemas[schema_id] = stored
            st.ids[fingerprint(stored)] = schema_id
        for name, versions in data["subjects"].items():
            st.subjects[name] = {v: SubjectVersion(v, i, d) for v, i, d in versions}
        st.compatibility = dict(data["compatibility"])
        return st

    # ------------------------------------------------------------------ reads

    def level(self, subject: str | None) -> str:
        if subject is not None and subject in self.compatibility:
            return self.compatibility[subject]
        return self.global_compatibility or DEFAULT_COMPATIBILITY

    def versions(self, subject: str, deleted: bool = False) -> list[SubjectVersion]:
        """A subject's versions in order; 40401 when it has none (live ones unless `deleted`)."""
        found = [v for _, v in sorted(self.subjects.get(subject, {}).items()) if deleted or not v.deleted]
        if not found:
            raise subject_not_found(subject)
        return found

    def version(self, subject: str, spec: str, deleted: bool = False) -> SubjectVersion:
        """`spec`: a version number, "latest" or -1."""
        number = parse_version(spec)
        versions = self.versions(subject, deleted=True)
        if number == -1:
            live = [v for v in versions if deleted or not v.deleted]
            if not live:
                raise subject_not_found(subject)
            return live[-1]
        for v in versions:
            if v.version == number and (deleted or not v.deleted):
                return v
        raise version_not_found(subject, number)

    def schema(self, schema_id: int) -> StoredSchema:
        stored = self.schemas.get(schema_id)
        if stored is None or not any(v.schema_id == schema_id for vs in self.subjects.values() for v in vs.values()):
            raise schema_not_found(f"Schema {schema_id} not found")
        return stored

    def usages(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        return sorted(
            (name, v.version)
            for name, vs in self.subjects.items()
            for v in vs.values()
            if v.schema_id == schema_id and (deleted or not v.deleted)
        )

    def lookup(self, subject: str, candidate: StoredSchema, deleted: bool = False) -> SubjectVersion:
        """The subject's version holding this schema (POST /subjects/{subject})."""
        versions = self.versions(subject, deleted=deleted)
        schema_id = self.ids.get(fingerprint(candidate))
        for v in reversed(versions):
            if v.schema_id == schema_id:
                return v
        raise schema_not_found()

    def referenced_texts(self, references: list[dict[str, Any]]) -> list[str]:
        """The texts of `references` (and theirs, first), for parsing a schema that uses them."""
        return [stored.schema for _, stored in self.referenced(references)]

    def referenced(self, references: list[dict[str, Any]], depth: int = 0) -> list[tuple[str, StoredSchema]]:
        """(reference name, schema) of `references` and theirs, dependencies first."""
        if depth > MAX_REFERENCE_DEPTH:
            raise invalid_schema(f"Invalid schema: references nested deeper than {MAX_REFERENCE_DEPTH}")
        found: list[tuple[str, StoredSchema]] = []
        for ref in references:
            subject, version = ref.get("subject"), ref.get("version")
            if not isinstance(subject, str) or not isinstance(ref.get("name"), str) or not isinstance(version, int):
                raise invalid_schema(f"Invalid schema: a reference needs name, subject and version: {ref}")
            try:
                v = self.version(subject, str(version))
            except RegistryError:
                raise invalid_schema(f"Invalid schema: reference {subject} version {version} does not exist") from None
            stored = self.schemas[v.schema_id]
            found += self.referenced(stored.references, depth + 1)
            found.append((ref["name"], stored))
        return found

    def parsed(self, stored: StoredSchema) -> Any:
        """A stored schema parsed for compatibility checks (fastavro's form, a FileDescriptorProto,
        a JSON schema document)."""
        if stored.schema_type == "PROTOBUF":
            return protobuf.decode(stored.schema)
        if stored.schema_type == "JSON":
            return json.loads(stored.schema)
        return avro.parse(stored.schema, self.referenced_texts(stored.references))

    def proto_imports(self, references: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(import path, `.proto` text) of a Protobuf schema's references, for compiling `.proto`
        text that imports them."""
        found = []
        for name, stored in self.referenced(references):
            if stored.schema_type != "PROTOBUF":
                raise invalid_schema(f"Invalid schema: reference {name} is a {stored.schema_type} schema")
            found.append((name, protobuf.render(protobuf.decode(stored.schema))))
        return found


def canonical(stored: StoredSchema) -> str:
    """The text that decides "same schema, same id" (and, for Protobuf, the form stored)."""
    try:
        if stored.schema_type == "PROTOBUF":
            return protobuf.canonical(stored.schema)
        return avro.canonical(stored.schema)
    except (avro.InvalidSchema, protobuf.InvalidSchema) as exc:
        raise invalid_schema(str(exc)) from None


def fingerprint(stored: StoredSchema) -> tuple[str, str, str]:
    refs = json.dumps(stored.references, sort_keys=True, separators=(",", ":"))
    return (stored.schema_type, canonical(stored), refs)


def parse_version(spec: str) -> int:
    if spec == "latest":
        return -1
    try:
        number = int(spec)
    except ValueError:
        raise invalid_version(spec) from None
    if number == -1 or 1 <= number <= MAX_VERSION:
        return number
    raise invalid_version(spec)


def check_subject(subject: str) -> None:
    if not subject or len(subject) > 1_000 or any(ord(c) < 32 for c in subject):
        raise RegistryError(422, 422, "Invalid subject name: 1 to 1000 characters, no control characters")


def validate(state: RegistryState, stored: StoredSchema) -> Any:
    """The parsed schema (AVRO) or document (JSON); 42201 when it is not a valid schema."""
    if stored.schema_type not in SCHEMA_TYPES:
        raise invalid_schema(
            f"Invalid schema: schema type {stored.schema_type} is not supported by this registry "
            f"(one of {', '.join(SCHEMA_TYPES)})"
        )
    if stored.schema_type == "JSON":
        for ref in stored.references:
            raise invalid_schema(f"Invalid schema: JSON schema references are not supported ({ref})")
        try:
            doc = json.loads(stored.schema)
        except (ValueError, RecursionError) as exc:
            raise invalid_schema(f"Invalid schema: not JSON: {exc}") from None
        if not isinstance(doc, (dict, bool)):
            raise invalid_schema("Invalid schema: a JSON schema is an object or a boolean")
        return doc
    try:
        if stored.schema_type == "PROTOBUF":
            refs = state.referenced(stored.references)
            if any(ref.schema_type != "PROTOBUF" for _, ref in refs):
                raise invalid_schema("Invalid schema: a Protobuf schema's references are Protobuf schemas")
            return protobuf.parse(stored.schema, [(name, ref.schema) for name, ref in refs])
        return avro.parse(stored.schema, state.referenced_texts(stored.references))
    except (avro.InvalidSchema, protobuf.InvalidSchema) as exc:
        raise invalid_schema(str(exc)) from None


def problems(
    state: RegistryState, level: str, stored: StoredSchema, new: Any, previous: list[StoredSchema]
) -> list[str]:
    """Compatibility problems of `new` (parsed `stored`) against `previous` under `level`
    ([] = compatible), by the rule of its schema type."""
    try:
        return avro.check_compatibility(
            level, new, [state.parsed(p) for p in previous], INCOMPATIBILITY[stored.schema_type]
        )
    except RecursionError:
        raise invalid_schema("Invalid schema: nested too deeply to check its compatibility") from None


# --------------------------------------------------------------------------- commands


def register(tx: Tx, subject: str, stored: StoredSchema) -> tuple[int, int]:
    """POST /subjects/{subject}/versions: (schema id, version). Registering a schema the
    subject already has (live) changes nothing and answers its id and version."""
    check_subject(subject)
    reg = tx.state.schema_registry
    new = validate(reg, stored)
    if stored.schema_type == "PROTOBUF":  # stored in the canonical form: a GET renders either form from it
        stored = StoredSchema(stored.schema_type, canonical(stored), stored.references)
    schema_id = reg.ids.get(fingerprint(stored))
    existing = reg.subjects.get(subject, {})
    for v in sorted(existing.values(), key=lambda v: -v.version):
        if v.schema_id == schema_id and not v.deleted:
            return v.schema_id, v.version
    live = [v for _, v in sorted(existing.items()) if not v.deleted]
    level = reg.level(subject)
    if live and level != "NONE":
        previous_types = {reg.schemas[v.schema_id].schema_type for v in live}
        if previous_types != {stored.schema_type}:
            raise RegistryError(
                409,
                409,
                f"Schema being registered is incompatible with an earlier schema for subject '{subject}': "
                f"schema type {stored.schema_type} after {', '.join(sorted(previous_types))} (level {level})",
            )
        found = problems(reg, level, stored, new, [reg.schemas[v.schema_id] for v in live])
        if found:
            raise RegistryError(
                409,
                409,
                f"Schema being registered is incompatible with an earlier schema for subject '{subject}' "
                f"(compatibility {level}): " + "; ".join(found),
            )
    if schema_id is None:
        schema_id = reg.next_id
    version = max(existing, default=0) + 1
    if version > MAX_VERSION:
        raise invalid_version(version)
    tx.emit(r.SchemaRegistered(subject, version, schema_id, stored.schema_type, stored.schema, stored.references))
    return schema_id, version


def test_compatibility(state: RegistryState, subject: str, spec: str, stored: StoredSchema) -> list[str]:
    """POST /compatibility/subjects/{subject}/versions/{version}: the problems ([] = compatible)."""
    new = validate(state, stored)
    level = state.level(subject)
    target = state.version(subject, spec)
    old = state.schemas[target.schema_id]
    if old.schema_type != stored.schema_type:
        return [f"schema type {stored.schema_type} against {old.schema_type}"]
    if spec in ("latest", "-1") and level.endswith("_TRANSITIVE"):
        return problems(state, level, stored, new, [state.schemas[v.schema_id] for v in state.versions(subject)])
    return problems(state, level.removesuffix("_TRANSITIVE"), stored, new, [old])


def _referenced(state: RegistryState, subject: str, version: int) -> bool:
    return any(
        ref.get("subject") == subject and ref.get("version") == version
        for sid, stored in state.schemas.items()
        for ref in stored.references
        if state.usages(sid)
    )


def delete_subject(tx: Tx, subject: str, permanent: bool) -> list[int]:
    """DELETE /subjects/{subject}: the versions deleted. Permanent needs a soft delete first."""
    reg = tx.state.schema_registry
    versions = reg.versions(subject, deleted=True)
    live = [v for v in versions if not v.deleted]
    if permanent:
        if live:
            raise RegistryError(
                404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
            )
    elif not live:
        raise RegistryError(
            404, 40404, f"Subject '{subject}' was soft deleted. Set permanent=true to delete permanently"
        )
    targets = versions if permanent else live
    for v in targets:
        if _referenced(reg, subject, v.version):
            raise RegistryError(
                422, 42206, f"One or more references exist to the schema {{subject={subject}, version={v.version}}}"
            )
    for v in targets:
        tx.emit(r.SchemaVersionDeleted(subject, v.version, permanent))
    if permanent and subject in reg.compatibility:
        tx.emit(r.SchemaConfigSet(subject, None))
    return [v.version for v in targets]


def delete_version(tx: Tx, subject: str, spec: str, permanent: bool) -> int:
    """DELETE /subjects/{subject}/versions/{version}: the version deleted."""
    reg = tx.state.schema_registry
    number = parse_version(spec)
    versions = reg.versions(subject, deleted=True)
    if number == -1:
        live = [v for v in versions if not v.deleted]
        if not live:
            raise subject_not_found(subject)
        target = live[-1]
    else:
        match = [v for v in versions if v.version == number]
        if not match:
            raise version_not_found(subject, number)
        target = match[0]
    if permanent and not target.deleted:
        raise RegistryError(
            404,
            40407,
            f"Subject '{subject}' Version {target.version} was not deleted first before being permanently deleted",
        )
    if not permanent and target.deleted:
        raise RegistryError(
            404,
            40406,
            f"Subject '{subject}' Version {target.version} was soft deleted. Set permanent=true to delete permanently",
        )
    if _referenced(reg, subject, target.version):
        raise RegistryError(
            422, 42206, f"One or more references exist to the schema {{subject={subject}, version={target.version}}}"
        )
    tx.emit(r.SchemaVersionDeleted(subject, target.version, permanent))
    return target.version


def set_compatibility(tx: Tx, subject: str | None, level: object) -> str:
    if not isinstance(level, str) or level.upper() not in avro.COMPATIBILITY_LEVELS:
        raise invalid_compatibility(level)
    if subject is not None:
        check_subject(subject)
    tx.emit(r.SchemaConfigSet(subject, level.upper()))
    return level.upper()


def delete_compatibility(tx: Tx, subject: str | None) -> str:
    """DELETE /config[/{subject}]: the level in force before."""
    reg = tx.state.schema_registry
    before = reg.level(subject)
    if subject is not None and subject not in reg.compatibility:
        if subject not in reg.subjects:
            raise subject_not_found(subject)
        return before
    tx.emit(r.SchemaConfigSet(subject, None))
    return before
