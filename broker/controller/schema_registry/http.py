"""The Confluent Schema Registry REST API, served by the controller (aiohttp routes).

The subset Confluent's clients use (confluent-kafka's `SchemaRegistryClient` and its Avro,
JSON Schema and Protobuf serializers, Kafka Connect's converters): register and look up schemas, schemas
by id, subjects and versions, soft and permanent deletes, compatibility levels and checks,
the (read-write only) mode. Bodies and errors are Confluent's:
`{"error_code": 40401, "message": "..."}` with content type
`application/vnd.schemaregistry.v1+json`.

The active controller answers; a standby forwards the request to it (the controller's own
credentials), so every controller's URL can go into a client's `url` list. Writes are
metadata-log entries (group commit); reads come from the durable state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from automq.broker.controller.controller import Controller
from automq.broker.controller.schema_registry import model, protobuf, protoc
from automq.broker.controller.schema_registry.model import RegistryError, RegistryState, StoredSchema
from automq.broker.security.controller_auth import ControllerClientAuth
from automq.broker.storage.metadata import MetadataError, NotControllerError

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_BODY_BYTES = 8 << 20  # a schema document; Confluent's own default limit is lower
PREFIXES = ("/subjects", "/schemas", "/config", "/mode", "/compatibility")
FORWARD_TIMEOUT_S = 30.0
FORWARDED = "X-AutoMQ-Forwarded"  # a forwarded call is never forwarded again (no loops between stale standbys)


def is_registry_path(path: str) -> bool:
    return path == "/" or any(path == p or path.startswith(p + "/") for p in PREFIXES)


def reply(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type=CONTENT_TYPE)


def error(status: int, error_code: int, message: str) -> web.Response:
    return reply({"error_code": error_code, "message": message}, status)


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise RegistryError(413, 413, f"Request body of {request.content_length} bytes exceeds {MAX_BODY_BYTES}")
    raw = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise RegistryError(413, 413, f"Request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(bytes(raw) or b"null")
    except (ValueError, RecursionError) as exc:
        raise RegistryError(400, 400, f"Unexpected request body: not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RegistryError(422, 422, "Unexpected request body: a JSON object is expected")
    return body


def _schema_of(body: dict[str, Any]) -> StoredSchema:
    text = body.get("schema")
    if not isinstance(text, str) or not text.strip():
        raise model.invalid_schema("Invalid schema: the request has no 'schema' string")
    schema_type = body.get("schemaType") or "AVRO"
    references = body.get("references") or []
    if not isinstance(schema_type, str) or not isinstance(references, list):
        raise RegistryError(422, 422, "Unexpected request body: schemaType is a string, references a list")
    if any(not isinstance(ref, dict) for ref in references):
        raise model.invalid_schema("Invalid schema: each reference is an object with name, subject and version")
    if body.get("ruleSet") or body.get("metadata"):
        raise model.invalid_schema("Invalid schema: metadata and rule sets (data contracts) are not supported here")
    refs = [{"name": x.get("name"), "subject": x.get("subject"), "version": x.get("version")} for x in references]
    return StoredSchema(schema_type.upper(), text, refs)


def _text(stored: StoredSchema, fmt: str | None) -> str:
    """The schema as a GET answers it: Protobuf as `.proto` text, or with `?format=serialized`
    as the stored base64 FileDescriptorProto (Confluent's two forms)."""
    if stored.schema_type == "PROTOBUF" and fmt != "serialized":
        return protobuf.render(protobuf.decode(stored.schema))
    return stored.schema


def _schema_body(stored: StoredSchema, fmt: str | None = None, text: str | None = None, **extra: Any) -> dict[str, Any]:
    """`text`: the schema as the request gave it (a registration answers in the client's own form)."""
    out = dict(extra)
    if stored.schema_type != "AVRO":
        out["schemaType"] = stored.schema_type
    if stored.references:
        out["references"] = stored.references
    out["schema"] = text if text is not None else _text(stored, fmt)
    return out


def _version_body(
    reg: RegistryState, subject: str, v: model.SubjectVersion, fmt: str | None = None, text: str | None = None
) -> dict[str, Any]:
    return _schema_body(reg.schemas[v.schema_id], fmt, text, subject=subject, version=v.version, id=v.schema_id)


def _schema_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise model.schema_not_found(f"Schema {request.match_info['id']} not found") from None


def add_routes(app: web.Application, controller: Controller, forward_auth: ControllerClientAuth | None = None) -> None:
    """Serve the registry on `app` (the controller's HTTP application)."""
    session: dict[str, aiohttp.ClientSession] = {}

    async def read(fn: Callable[[RegistryState], Any]) -> Any:
        return await controller.read(lambda st: fn(st.schema_registry))

    async def compiled(stored: StoredSchema) -> StoredSchema:
        """Protobuf `.proto` text compiled to the serialized form the registry keeps (other
        schemas as they are)."""
        if stored.schema_type != "PROTOBUF" or protobuf.is_serialized(stored.schema):
            return stored
        imports = await read(lambda reg: reg.proto_imports(stored.references))
        try:
            serialized = await protoc.compile_text(stored.schema, imports)
        except protobuf.InvalidSchema as exc:
            raise model.invalid_schema(str(exc)) from None
        return StoredSchema(stored.schema_type, serialized, stored.references)

    async def forward(request: web.Request, raw: bytes) -> web.Response:
        leader = controller.leader_url
        if not leader or leader == controller.url or FORWARDED in request.headers:
            return error(503, 50004, "No active controller to serve the schema registry right now; retry")
        if "client" not in session or session["client"].closed:
            session["client"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S))
        headers = {"Content-Type": request.headers.get("Content-Type", CONTENT_TYPE), FORWARDED: controller.url}
        if forward_auth is not None:
            headers.update(forward_auth.headers())
        elif "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        try:
            async with session["client"].request(
                request.method,
                leader.rstrip("/") + request.path_qs,
                data=raw or None,
                headers=headers,
                ssl=forward_auth.ssl if forward_auth is not None and forward_auth.ssl is not None else True,
            ) as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, content_type=CONTENT_TYPE)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error(500, 50003, f"Error while forwarding the request to the leader {leader}: {exc}")

    async def on_cleanup(app: web.Application) -> None:
        if "client" in session:
            await session["client"].close()

    app.on_cleanup.append(on_cleanup)

    def route(fn: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            if not controller.is_leader:
                try:
                    raw = await request.read() if request.can_read_body else b""
                except web.HTTPRequestEntityTooLarge:
                    return error(413, 413, "Request body too large")
                return await forward(request, raw)
            try:
                return await fn(request)
            except RegistryError as exc:
                return error(exc.status, exc.error_code, str(exc))
            except NotControllerError:
                # lost leadership mid-call: whether a write became durable is unknown, and a
                # retry is safe (registering again answers the same id); 503 is one clients retry
                return error(503, 50004, "The controller stopped leading while serving this request; retry")
            except MetadataError as exc:
                return error(500, 50001, f"Error in the backend metadata store: {exc}")
            except Exception as exc:
                log.exception("schema registry %s %s failed", request.method, request.path)
                return error(500, 50001, f"Error in the backend metadata store: {type(exc).__name__}")

        return handle

    @route
    async def root(request: web.Request) -> web.Response:
        return reply({})

    @route
    async def schema_types(request: web.Request) -> web.Response:
        return reply(list(model.SCHEMA_TYPES))

    @route
    async def subjects(request: web.Request) -> web.Response:
        deleted = _flag(request, "deleted")
        prefix = request.query.get("subjectPrefix", "")

        def names(reg: RegistryState) -> list[str]:
            return sorted(
                n
                for n, vs in reg.subjects.items()
                if n.startswith(prefix) and any(deleted or not v.deleted for v in vs.values())
            )

        return reply(await read(names))

    @route
    async def versions(request: web.Request) -> web.Response:
        subject, deleted = request.match_info["subject"], _flag(request, "deleted")
        return reply(await read(lambda reg: [v.version for v in reg.versions(subject, deleted)]))

    @route
    async def version(request: web.Request) -> web.Response:
        subject, spec, deleted = request.match_info["subject"], request.match_info["version"], _flag(request, "deleted")
        fmt = request.query.get("format")
        return reply(await read(lambda reg: _version_body(reg, subject, reg.version(subject, spec, deleted), fmt)))

    @route
    async def version_schema(request: web.Request) -> web.Response:
        subject, spec = request.match_info["subject"], request.match_info["version"]
        fmt = request.query.get("format")
        text = await read(lambda reg: _text(reg.schemas[reg.version(subject, spec).schema_id], fmt))
        return web.Response(text=text, content_type=CONTENT_TYPE)

    @route
    async def register(request: web.Request) -> web.Response:
        subject = request.match_info["subject"]
        given = _schema_of(await _json_body(request))
        stored = await compiled(given)
        schema_id, number = await controller.execute(lambda tx: model.register(tx, subject, stored))
        return reply(_schema_body(stored, text=given.schema, id=schema_id, subject=subject, version=number))

    @route
    async def lookup(request: web.Request) -> web.Response:
        subject, deleted, fmt = request.match_info["subject"], _flag(request, "deleted"), request.query.get("format")
        given = _schema_of(await _json_body(request))
        stored = await compiled(given)

        def find(reg: RegistryState) -> dict[str, Any]:
            model.validate(reg, stored)
            version = reg.lookup(subject, stored, deleted)
            return _version_body(reg, subject, version, fmt, None if fmt else given.schema)

        return reply(await read(find))

    @route
    async def delete_subject(request: web.Request) -> web.Response:
        subject, permanent = request.match_info["subject"], _flag(request, "permanent")
        return reply(await controller.execute(lambda tx: model.delete_subject(tx, subject, permanent)))

    @route
    async def delete_version(request: web.Request) -> web.Response:
        subject, spec = request.match_info["subject"], request.match_info["version"]
        permanent = _flag(request, "permanent")
        return reply(await controller.execute(lambda tx: model.delete_version(tx, subject, spec, permanent)))

    @route
    async def schema_by_id(request: web.Request) -> web.Response:
        schema_id, fmt = _schema_id(request), request.query.get("format")
        return reply(await read(lambda reg: _schema_body(reg.schema(schema_id), fmt)))

    @route
    async def schema_text_by_id(request: web.Request) -> web.Response:
        schema_id, fmt = _schema_id(request), request.query.get("format")
        text = await read(lambda reg: _text(reg.schema(schema_id), fmt))
        return web.Response(text=text, content_type=CONTENT_TYPE)

    @route
    async def schema_subjects(request: web.Request) -> web.Response:
        schema_id, deleted = _schema_id(request), _flag(request, "deleted")

        def find(reg: RegistryState) -> list[str]:
            reg.schema(schema_id)
            return sorted({s for s, _ in reg.usages(schema_id, deleted)})

        return reply(await read(find))

    @route
    async def schema_versions(request: web.Request) -> web.Response:
        schema_id, deleted = _schema_id(request), _flag(request, "deleted")

        def find(reg: RegistryState) -> list[dict[str, Any]]:
            reg.schema(schema_id)
            return [{"subject": s, "version": v} for s, v in reg.usages(schema_id, deleted)]

        return reply(await read(find))

    @route
    async def get_config(request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")

        def level(reg: RegistryState) -> dict[str, Any]:
            if subject is not None and subject not in reg.compatibility and not _flag(request, "defaultToGlobal"):
                if subject not in reg.subjects:
                    raise model.subject_not_found(subject)
                raise RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
                )
            return {"compatibilityLevel": reg.level(subject)}

        return reply(await read(level))

    @route
    async def put_config(request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        body = await _json_body(request)
        level = await controller.execute(lambda tx: model.set_compatibility(tx, subject, body.get("compatibility")))
        return reply({"compatibility": level})

    @route
    async def delete_config(request: web.Request) -> web.Response:
        subject = request.match_info.get("subject")
        level = await controller.execute(lambda tx: model.delete_compatibility(tx, subject))
        return reply({"compatibilityLevel": level})

    @route
    async def compatibility(request: web.Request) -> web.Response:
        subject, spec = request.match_info["subject"], request.match_info.get("version", "latest")
        stored = await compiled(_schema_of(await _json_body(request)))
        verbose = _flag(request, "verbose")

        def check(reg: RegistryState) -> dict[str, Any]:
            if subject not in reg.subjects and spec == "latest":
                model.validate(reg, stored)
                return {"is_compatible": True}
            problems = model.test_compatibility(reg, subject, spec, stored)
            out: dict[str, Any] = {"is_compatible": not problems}
            if verbose:
                out["messages"] = problems
            return out

        return reply(await read(check))

    @route
    async def mode(request: web.Request) -> web.Response:
        return reply({"mode": "READWRITE"})

    @route
    async def put_mode(request: web.Request) -> web.Response:
        body = await _json_body(request)
        if body.get("mode") != "READWRITE":
            raise RegistryError(422, 42204, "Only mode READWRITE is supported by this registry")
        return reply({"mode": "READWRITE"})

    r = app.router
    r.add_get("/", root)
    r.add_get("/schemas/types", schema_types)
    r.add_get("/schemas/ids/{id}", schema_by_id)
    r.add_get("/schemas/ids/{id}/schema", schema_text_by_id)
    r.add_get("/schemas/ids/{id}/subjects", schema_subjects)
    r.add_get("/schemas/ids/{id}/versions", schema_versions)
    r.add_get("/subjects", subjects)
    r.add_post("/subjects/{subject}", lookup)
    r.add_delete("/subjects/{subject}", delete_subject)
    r.add_get("/subjects/{subject}/versions", versions)
    r.add_post("/subjects/{subject}/versions", register)
    r.add_get("/subjects/{subject}/versions/{version}", version)
    r.add_get("/subjects/{subject}/versions/{version}/schema", version_schema)
    r.add_delete("/subjects/{subject}/versions/{version}", delete_version)
    r.add_get("/config", get_config)
    r.add_put("/config", put_config)
    r.add_delete("/config", delete_config)
    r.add_get("/config/{subject}", get_config)
    r.add_put("/config/{subject}", put_config)
    r.add_delete("/config/{subject}", delete_config)
    r.add_post("/compatibility/subjects/{subject}/versions", compatibility)
    r.add_post("/compatibility/subjects/{subject}/versions/{version}", compatibility)
    r.add_get("/mode", mode)
    r.add_put("/mode", put_mode)


@web.middleware
async def confluent_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own answers on registry paths (no such route, wrong method) in Confluent's form."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if not is_registry_path(request.path) or exc.status < 400:
            raise
        return error(exc.status, exc.status, f"{exc.reason}: {request.method} {request.path}")
