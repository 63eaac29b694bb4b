"""The controller's HTTP API (aiohttp): one `POST /v1/<method>` per client method.

Bodies are JSON objects validated by the pydantic models below (unknown fields, wrong
types and out-of-range numbers are rejected with INVALID_REQUEST before the controller sees
them). A success is `200` with a JSON object; an error is

    {"error": "<CODE>", "message": "...", "leader_url": "http://..." | null}

with status 400 (INVALID_REQUEST), 409 (a MetadataError: stale epoch, offset mismatch, ...),
421 (NOT_CONTROLLER: retry at `leader_url`) or 500. Also served: `GET /v1/status`,
`/healthz`, `/readyz` (200 when leader or a caught-up standby) and `/metrics` (Prometheus).
docs/controller-api.md lists every method.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from automq.broker.controller import commands, security, users
from automq.broker.controller.acls import AclBinding, AclFilter
from automq.broker.controller.controller import Controller
from automq.broker.controller.protocol import (
    ControllerAuthenticationError,
    DelegationTokenInfo,
    Endpoint,
    InvalidRequestError,
    ScramCredentialInfo,
)
from automq.broker.controller.schema_registry import http as schema_registry
from automq.broker.controller.wire import to_wire
from automq.broker.security.controller_auth import ControllerClientAuth, ControllerServerAuth
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    MetadataError,
    NotControllerError,
    ObjectStreamRange,
    StreamObject,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20

NodeId = Annotated[int, Field(ge=0, le=2**31 - 1)]
OptNodeId = Annotated[int, Field(ge=-1, le=2**31 - 1)]  # -1: not a broker (compaction jobs)
Epoch = Annotated[int, Field(ge=0, le=2**63 - 1)]
OptEpoch = Annotated[int, Field(ge=-1, le=2**63 - 1)]
Offset = Annotated[int, Field(ge=0, le=2**63 - 1)]
Id = Annotated[int, Field(ge=0, le=2**63 - 1)]
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]
AckLeaseMs = Annotated[int, Field(ge=0, le=600_000)]  # 0: no acknowledgement lease asked for
Name = Annotated[str, Field(min_length=1, max_length=255)]


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class EndpointModel(_Req):
    listener: Name
    host: Name
    port: Annotated[int, Field(ge=1, le=65535)]


class RegisterBroker(_Req):
    node_id: NodeId
    endpoints: list[EndpointModel] = Field(max_length=64)
    rack: Annotated[str, Field(max_length=255)] | None = None
    ack_lease_ms: AckLeaseMs = 0


class NodeRef(_Req):
    node_id: NodeId
    node_epoch: Epoch


class Heartbeat(NodeRef):
    ack_lease_ms: AckLeaseMs = 0


class NodeOnly(_Req):
    node_id: NodeId


class WatchMetadata(_Req):
    since_version: Annotated[int, Field(ge=-1)] = -1
    timeout_ms: Annotated[int, Field(ge=0, le=600_000)] = 0
    node_id: OptNodeId = -1  # a broker: it has applied since_version


class AwaitApplied(_Req):
    version: Annotated[int, Field(ge=0)]
    timeout_ms: Annotated[int, Field(ge=0, le=600_000)] = 0
    topics: Annotated[list[Name], Field(max_length=10_000)] = []


class CreateTopic(_Req):
    name: Name
    partitions: Count
    configs: dict[str, str] = Field(default_factory=dict)


class TopicName(_Req):
    name: Name


class CreatePartitions(_Req):
    name: Name
    total_count: Count


class AlterTopicConfigs(_Req):
    name: Name
    configs: dict[str, str | None]


class AlterGroupConfigs(_Req):
    group_id: Name
    configs: dict[Annotated[str, Field(max_length=255)], Annotated[str, Field(max_length=1_000)] | None] = Field(
        max_length=64
    )


class ReassignPartition(_Req):
    topic: Name
    partition: Count
    target_node_id: NodeId


class PartitionClosed(_Req):
    topic: Name
    partition: Count
    node_id: NodeId
    node_epoch: Epoch
    leader_epoch: Epoch


class JobRef(_Req):
    job_id: Id


class JobNodeRef(_Req):
    job_id: Id
    node_id: OptNodeId  # -1 with node_epoch -1: the operator
    node_epoch: OptEpoch


class CreateStream(_Req):
    tags: dict[str, str] | None = None


class StreamRef(_Req):
    stream_id: Id
    epoch: Epoch
    node_id: NodeId
    node_epoch: Epoch


class TrimStream(StreamRef):
    new_start_offset: Offset


class GetStreams(_Req):
    stream_ids: list[Id] = Field(max_length=100_000)


class PrepareObjects(_Req):
    count: Count
    ttl_ms: Annotated[int, Field(ge=0, le=2**31 - 1)]


class ObjectStreamRangeModel(_Req):
    stream_id: Id
    epoch: Epoch
    start_offset: Offset
    end_offset: Offset
    size: Offset


class StreamObjectModel(_Req):
    object_id: Id
    object_size: Offset
    stream_id: Id
    start_offset: Offset
    end_offset: Offset
    source_object_ids: list[Id] = Field(default_factory=list, max_length=100_000)

    def to_domain(self) -> StreamObject:
        return StreamObject(
            self.object_id,
            self.object_size,
            self.stream_id,
            self.start_offset,
            self.end_offset,
            tuple(self.source_object_ids),
        )


class CommitStreamSetObject(_Req):
    node_id: OptNodeId
    node_epoch: OptEpoch
    object_id: Annotated[int, Field(ge=-1, le=2**63 - 1)]
    object_size: Offset
    stream_ranges: list[ObjectStreamRangeModel] = Field(default_factory=list, max_length=1_000_000)
    stream_objects: list[StreamObjectModel] = Field(default_factory=list, max_length=100_000)
    compacted_object_ids: list[Id] = Field(default_factory=list, max_length=100_000)

    def to_domain(self) -> CommitStreamSetObjectRequest:
        return CommitStreamSetObjectRequest(
            self.node_id,
            self.node_epoch,
            self.object_id,
            self.object_size,
            tuple(
                ObjectStreamRange(x.stream_id, x.epoch, x.start_offset, x.end_offset, x.size)
                for x in self.stream_ranges
            ),
            tuple(so.to_domain() for so in self.stream_objects),
            tuple(self.compacted_object_ids),
        )


class CommitStreamObject(_Req):
    object: StreamObjectModel
    node_id: OptNodeId
    node_epoch: OptEpoch


class GetObjects(_Req):
    stream_id: Id
    start_offset: Offset
    end_offset: Annotated[int, Field(ge=-1, le=2**63 - 1)] = -1
    limit: Annotated[int, Field(ge=1, le=100_000)] = 1000


class GetStreamSetObjects(_Req):
    node_id: NodeId | None = None


class Empty(_Req):
    pass


Code = Annotated[int, Field(ge=-128, le=127)]  # Kafka's int8 ACL codes
Text = Annotated[str, Field(max_length=32_767)]


class AclBindingModel(_Req):
    resource_type: Code
    resource_name: Text
    pattern_type: Code
    principal: Text
    host: Text
    operation: Code
    permission: Code


class AclFilterModel(_Req):
    resource_type: Code
    resource_name: Text | None
    pattern_type: Code
    principal: Text | None
    host: Text | None
    operation: Code
    permission: Code


class CreateAcls(_Req):
    bindings: list[AclBindingModel] = Field(max_length=100_000)


class DeleteAcls(_Req):
    filters: list[AclFilterModel] = Field(max_length=10_000)


class QuotaEntry(_Req):
    entity: list[tuple[Text, Text | None]] = Field(max_length=8)
    ops: dict[Text, float | None]


class AlterClientQuotas(_Req):
    entries: list[QuotaEntry] = Field(max_length=10_000)
    validate_only: bool = False


# --------------------------------------------------------------------------- methods

Handler = Callable[[Controller, Any], Awaitable[Any]]
METHODS: dict[str, tuple[type[_Req], Handler]] = {}


def method(name: str, model: type[_Req]):
    def wrap(fn: Handler) -> Handler:
        METHODS[name] = (model, fn)
        return fn

    return wrap


@method("register_broker", RegisterBroker)
async def _register_broker(c: Controller, q: RegisterBroker) -> dict:
    endpoints = [Endpoint(e.listener, e.host, e.port) for e in q.endpoints]
    epoch = await c.register_broker(q.node_id, endpoints, q.rack)
    return {"node_epoch": epoch, "ack_lease_ms": c.grant_ack_lease(q.node_id, q.ack_lease_ms)}


@method("heartbeat", Heartbeat)
async def _heartbeat(c: Controller, q: Heartbeat) -> dict:
    state = await c.heartbeat(q.node_id, q.node_epoch)
    return {"state": state, "ack_lease_ms": c.grant_ack_lease(q.node_id, q.ack_lease_ms)}


@method("unregister_broker", NodeRef)
async def _unregister_broker(c: Controller, q: NodeRef) -> dict:
    await c.unregister_broker(q.node_id, q.node_epoch)
    return {}


@method("watch_metadata", WatchMetadata)
async def _watch_metadata(c: Controller, q: WatchMetadata) -> dict:
    return to_wire(await c.watch(q.since_version, q.timeout_ms, q.node_id))


@method("await_applied", AwaitApplied)
async def _await_applied(c: Controller, q: AwaitApplied) -> dict:
    return await c.await_applied(q.version, q.timeout_ms, tuple(q.topics))


@method("create_topic", CreateTopic)
async def _create_topic(c: Controller, q: CreateTopic) -> dict:
    return to_wire(await c.execute(lambda tx: commands.create_topic(tx, q.name, q.partitions, dict(q.configs))))


@method("delete_topic", TopicName)
async def _delete_topic(c: Controller, q: TopicName) -> dict:
    await c.execute(lambda tx: commands.delete_topic(tx, q.name))
    return {}


@method("create_partitions", CreatePartitions)
async def _create_partitions(c: Controller, q: CreatePartitions) -> dict:
    return to_wire(await c.execute(lambda tx: commands.create_partitions(tx, q.name, q.total_count)))


@method("alter_topic_configs", AlterTopicConfigs)
async def _alter_topic_configs(c: Controller, q: AlterTopicConfigs) -> dict:
    await c.execute(lambda tx: commands.alter_topic_configs(tx, q.name, dict(q.configs)))
    return {}


@method("alter_group_configs", AlterGroupConfigs)
async def _alter_group_configs(c: Controller, q: AlterGroupConfigs) -> dict:
    await c.execute(lambda tx: commands.alter_group_configs(tx, q.group_id, dict(q.configs)))
    return {}


@method("reassign_partition", ReassignPartition)
async def _reassign_partition(c: Controller, q: ReassignPartition) -> dict:
    await c.execute(lambda tx: commands.reassign_partition(tx, q.topic, q.partition, q.target_node_id))
    return {}


@method("partition_closed", PartitionClosed)
async def _partition_closed(c: Controller, q: PartitionClosed) -> dict:
    await c.execute(
        lambda tx: commands.partition_closed(tx, q.topic, q.partition, q.node_id, q.node_epoch, q.leader_epoch)
    )
    return {}


@method("drain_broker", NodeOnly)
async def _drain_broker(c: Controller, q: NodeOnly) -> dict:
    await c.execute(lambda tx: commands.drain_broker(tx, q.node_id))
    return {}


@method("undrain_broker", NodeOnly)
async def _undrain_broker(c: Controller, q: NodeOnly) -> dict:
    await c.execute(lambda tx: commands.undrain_broker(tx, q.node_id))
    return {}


@method("fence_broker", NodeOnly)
async def _fence_broker(c: Controller, q: NodeOnly) -> dict:
    await c.execute(lambda tx: commands.fence_broker(tx, q.node_id))
    return {}


@method("broker_sessions", Empty)
async def _broker_sessions(c: Controller, q: Empty) -> dict:
    return {"brokers": await c.broker_sessions(), "session_timeout_ms": c.session_timeout_ms}


@method("list_wal_recovery_jobs", Empty)
async def _list_wal_recovery_jobs(c: Controller, q: Empty) -> dict:
    image = await c.read(lambda st: st.image())
    return {"jobs": to_wire(image.wal_recovery_jobs)}


@method("claim_wal_recovery", JobNodeRef)
async def _claim_wal_recovery(c: Controller, q: JobNodeRef) -> dict:
    return {"recovery_epoch": await c.claim_wal_recovery(q.job_id, q.node_id, q.node_epoch)}


@method("complete_wal_recovery", JobNodeRef)
async def _complete_wal_recovery(c: Controller, q: JobNodeRef) -> dict:
    await c.execute(lambda tx: commands.complete_wal_recovery(tx, q.job_id, q.node_id, q.node_epoch))
    return {}


@method("abandon_wal_recovery", JobRef)
async def _abandon_wal_recovery(c: Controller, q: JobRef) -> dict:
    await c.execute(lambda tx: commands.abandon_wal_recovery(tx, q.job_id))
    return {}


@method("create_stream", CreateStream)
async def _create_stream(c: Controller, q: CreateStream) -> dict:
    return {"stream_id": await c.execute(lambda tx: commands.create_stream(tx, q.tags))}


@method("open_stream", StreamRef)
async def _open_stream(c: Controller, q: StreamRef) -> dict:
    return to_wire(await c.execute(lambda tx: commands.open_stream(tx, q.stream_id, q.epoch, q.node_id, q.node_epoch)))


@method("close_stream", StreamRef)
async def _close_stream(c: Controller, q: StreamRef) -> dict:
    await c.execute(lambda tx: commands.close_stream(tx, q.stream_id, q.epoch, q.node_id, q.node_epoch))
    return {}


@method("trim_stream", TrimStream)
async def _trim_stream(c: Controller, q: TrimStream) -> dict:
    await c.execute(
        lambda tx: commands.trim_stream(tx, q.stream_id, q.epoch, q.new_start_offset, q.node_id, q.node_epoch)
    )
    return {}


@method("delete_stream", StreamRef)
async def _delete_stream(c: Controller, q: StreamRef) -> dict:
    await c.execute(lambda tx: commands.delete_stream(tx, q.stream_id, q.epoch, q.node_id, q.node_epoch))
    return {}


@method("get_streams", GetStreams)
async def _get_streams(c: Controller, q: GetStreams) -> dict:
    return {"streams": to_wire(await c.read(lambda st: commands.get_streams(st, list(q.stream_ids))))}


@method("prepare_objects", PrepareObjects)
async def _prepare_objects(c: Controller, q: PrepareObjects) -> dict:
    return {"first_object_id": await c.execute(lambda tx: commands.prepare_objects(tx, q.count, q.ttl_ms))}


@method("commit_stream_set_object", CommitStreamSetObject)
async def _commit_stream_set_object(c: Controller, q: CommitStreamSetObject) -> dict:
    req = q.to_domain()
    await c.execute(lambda tx: commands.commit_stream_set_object(tx, req))
    return {}


@method("commit_stream_object", CommitStreamObject)
async def _commit_stream_object(c: Controller, q: CommitStreamObject) -> dict:
    obj = q.object.to_domain()
    await c.execute(lambda tx: commands.commit_stream_object(tx, obj, q.node_id, q.node_epoch))
    return {}


@method("get_objects", GetObjects)
async def _get_objects(c: Controller, q: GetObjects) -> dict:
    objs = await c.read(lambda st: commands.get_objects(st, q.stream_id, q.start_offset, q.end_offset, q.limit))
    return {"objects": to_wire(objs)}


@method("get_stream_set_objects", GetStreamSetObjects)
async def _get_stream_set_objects(c: Controller, q: GetStreamSetObjects) -> dict:
    return {"objects": to_wire(await c.read(lambda st: commands.get_stream_set_objects(st, q.node_id)))}


@method("create_acls", CreateAcls)
async def _create_acls(c: Controller, q: CreateAcls) -> dict:
    bindings = [AclBinding(**b.model_dump()) for b in q.bindings]
    results = await c.execute(lambda tx: security.create_acls(tx, bindings))
    return {"results": [list(x) for x in results]}


@method("delete_acls", DeleteAcls)
async def _delete_acls(c: Controller, q: DeleteAcls) -> dict:
    filters = [AclFilter(**f.model_dump()) for f in q.filters]
    results = await c.execute(lambda tx: security.delete_acls(tx, filters))
    return {"results": [[list(res), to_wire(matched)] for res, matched in results]}


@method("alter_client_quotas", AlterClientQuotas)
async def _alter_client_quotas(c: Controller, q: AlterClientQuotas) -> dict:
    entries = [([(t, n) for t, n in e.entity], dict(e.ops)) for e in q.entries]
    results = await c.execute(lambda tx: security.alter_client_quotas(tx, entries, q.validate_only))
    return {"results": [list(x) for x in results]}


# --------------------------------------------------------------------------- SCRAM users (issue 15)

B64 = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9+/=]+$")]


class ScramDeletion(_Req):
    user: Name
    mechanism: Name


class ScramUpsertion(_Req):
    user: Name
    mechanism: Name
    salt: B64
    iterations: Annotated[int, Field(ge=1, le=2**31 - 1)]
    stored_key: B64
    server_key: B64


class AlterScramCredentials(_Req):
    deletions: list[ScramDeletion] = Field(default_factory=list, max_length=10_000)
    upsertions: list[ScramUpsertion] = Field(default_factory=list, max_length=10_000)


@method("alter_scram_credentials", AlterScramCredentials)
async def _alter_scram_credentials(c: Controller, q: AlterScramCredentials) -> dict:
    deletions = [(d.user, d.mechanism) for d in q.deletions]
    upsertions = [ScramCredentialInfo(**u.model_dump()) for u in q.upsertions]
    results = await c.execute(lambda tx: users.alter_scram_credentials(tx, deletions, upsertions))
    return {"results": {u: (list(v) if v else None) for u, v in results.items()}}


class DelegationTokenChange(_Req):
    op: Annotated[str, Field(pattern=r"^(create|expiry)$")]
    token_id: Name
    owner: str = ""
    requester: str = ""
    renewers: list[str] = Field(default_factory=list, max_length=1_000)
    issue_ms: int = 0
    expiry_ms: int | None = None
    max_ms: int = 0


@method("delegation_token", DelegationTokenChange)
async def _delegation_token(c: Controller, q: DelegationTokenChange) -> dict:
    if q.op == "create":
        info = DelegationTokenInfo(
            q.token_id, q.owner, q.requester, tuple(q.renewers), q.issue_ms, q.expiry_ms or 0, q.max_ms
        )
        await c.execute(lambda tx: users.create_delegation_token(tx, info))
        return {"found": True}
    found = await c.execute(lambda tx: users.set_delegation_token_expiry(tx, q.token_id, q.expiry_ms))
    return {"found": found}


# --------------------------------------------------------------------------- app


def _error(exc: MetadataError, status: int, leader_url: str | None = None) -> web.Response:
    body = {"error": exc.code, "message": str(exc), "leader_url": leader_url}
    return web.json_response(body, status=status)


def _auth_middleware(auth: ControllerServerAuth):
    @web.middleware
    async def check(request: web.Request, handler):
        peer_certificate = None
        if auth.accept_client_certificates:
            transport = request.transport
            ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
            peer_certificate = ssl_object.getpeercert() if ssl_object is not None else None
        refusal = auth.refusal(request.path, request.headers.get("Authorization"), peer_certificate)
        if refusal is None:
            return await handler(request)
        log.warning("controller API: refused %s %s from %s: %s", request.method, request.path, request.remote, refusal)
        if schema_registry.is_registry_path(request.path):
            return schema_registry.error(401, 40101, f"Unauthorized: {refusal}")
        return _error(ControllerAuthenticationError(refusal), 401)

    return check


def build_registry_app(
    controller: Controller,
    auth: ControllerServerAuth | None = None,
    forward_auth: ControllerClientAuth | None = None,
) -> web.Application:
    """The schema registry alone (`controller.schema_registry_port`): the port can be opened
    to every client without exposing the controller API."""
    middlewares = [_auth_middleware(auth)] if auth else []
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[*middlewares, schema_registry.confluent_errors])
    schema_registry.add_routes(app, controller, forward_auth)
    return app


def build_app(
    controller: Controller,
    auth: ControllerServerAuth | None = None,
    forward_auth: ControllerClientAuth | None = None,
) -> web.Application:
    """`auth`: credentials every call but the open paths must carry (None: none, as before).
    `forward_auth`: what a standby sends when it forwards a schema-registry call to the leader.
    The registry's application, with the controller API's routes added."""
    app = build_registry_app(controller, auth, forward_auth)

    async def call(request: web.Request) -> web.Response:
        name = request.match_info["method"]
        entry = METHODS.get(name)
        if entry is None:
            return _error(InvalidRequestError(f"unknown method {name!r}; see docs/controller-api.md"), 404)
        model, handler = entry
        raw = await request.read()
        try:
            query = model.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:10])
            return _error(InvalidRequestError(f"{name}: {problems}"), 400)
        try:
            result = await handler(controller, query)
        except NotControllerError as exc:
            return _error(exc, 421, getattr(exc, "leader_url", None))
        except InvalidRequestError as exc:
            return _error(exc, 400)
        except MetadataError as exc:
            return _error(exc, 409)
        except Exception as exc:
            log.exception("controller API %s failed", name)
            return _error(MetadataError(f"internal controller error: {type(exc).__name__}"), 500)
        return web.Response(body=json.dumps(result, separators=(",", ":")), content_type="application/json")

    async def status(request: web.Request) -> web.Response:
        st = controller.state
        return web.json_response(
            {
                "controller_id": controller.controller_id,
                "role": controller.role.value,
                "ready": controller.ready,
                "leader_url": controller.leader_url,
                "term": st.term,
                "log_seq": st.last_seq,
                "metadata_version": st.version,
                "cluster_id": st.cluster_id,
            }
        )

    async def healthz(request: web.Request) -> web.Response:
        if controller.fatal is not None:
            return web.Response(status=500, text=f"fatal: {controller.fatal}\n")
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reason = controller.unready_reason()
        if reason is None:
            return web.Response(text=f"{controller.role.value}\n")
        return web.Response(status=503, text=f"{controller.role.value}: {reason}\n")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(controller.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_post("/v1/{method}", call)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
