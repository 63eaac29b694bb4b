"""`ControllerClient`: the only way brokers, local mode and the operator talk to controllers.

It implements `StreamManager` and `ObjectManager` (automq.broker.storage.metadata) and
`ClusterClient` (automq.broker.controller.protocol) over the HTTP API of `server.py`.

Following the leader: requests go to the last controller that answered as leader. A
NOT_CONTROLLER answer names the leader (`leader_url`) and the client goes there at once, in
the scheme it was configured with (`same_scheme`);
without a name (an election is running) or when a controller is unreachable, it tries the
next URL of its list, backing off, until `retry_deadline_s` passes, then raises
ControllerUnavailableError. Every other error code becomes its exception class
(`CLUSTER_ERRORS_BY_CODE`), e.g. StreamFencedError for a stale epoch.

Retries after a timeout may apply a request twice; the controller makes the ones that
matter idempotent (a commit of an already-committed object, open of an already-open
stream, close, trim and partition_closed succeed again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp

from automq.broker.controller import wire
from automq.broker.controller.acls import AclBinding, AclFilter
from automq.broker.controller.protocol import (
    CLUSTER_ERRORS_BY_CODE,
    ControllerAuthenticationError,
    ControllerUnavailableError,
    DelegationTokenInfo,
    Endpoint,
    MetadataImage,
    ScramCredentialInfo,
    TopicInfo,
    WalRecoveryJob,
)
from automq.broker.controller.wire import to_wire
from automq.broker.security.controller_auth import ControllerClientAuth
from automq.broker.storage.ack_lease import AckLease
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    MetadataError,
    NotControllerError,
    ObjectMetadata,
    StreamMetadata,
    StreamObject,
)

log = logging.getLogger(__name__)


def _stream_object(o: StreamObject) -> dict[str, Any]:
    return {
        "object_id": o.object_id,
        "object_size": o.object_size,
        "stream_id": o.stream_id,
        "start_offset": o.start_offset,
        "end_offset": o.end_offset,
        "source_object_ids": list(o.source_object_ids),
    }


def same_scheme(leader_url: str, called_url: str) -> str:
    """The leader's address with the scheme this client already speaks.

    A controller advertises the scheme it prefers; while a cluster switches between http and
    https its controllers serve both on one port and their clients are restarted one by one, so
    a client keeps the scheme it was configured with instead of the one advertised."""
    mine, _, _ = called_url.partition("://")
    theirs, sep, rest = leader_url.partition("://")
    return f"{mine}://{rest}" if sep and mine in ("http", "https") and theirs != mine else leader_url


class ControllerClient:
    def __init__(
        self,
        urls: list[str],
        *,
        request_timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
        auth: ControllerClientAuth | None = None,
    ) -> None:
        """`auth`: the token and TLS context to use (default: from AUTOMQ_CONTROLLER_TOKEN_FILE /
        AUTOMQ_CONTROLLER_CA_FILE, so CLIs and jobs without a node config can authenticate)."""
        if not urls:
            raise ValueError("ControllerClient needs at least one controller URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.request_timeout_s = request_timeout_s
        self.retry_deadline_s = retry_deadline_s
        self._leader: str | None = None
        self._next = 0
        self._session: aiohttp.ClientSession | None = None
        self.auth = auth if auth is not None else ControllerClientAuth.from_env()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, ssl=self.auth.ssl if self.auth.ssl is not None else True),
                json_serialize=lambda obj: json.dumps(obj, separators=(",", ":")),
            )
        return self._session

    def _rotate(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        self._next += 1
        return url

    async def call(self, method: str, body: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """POST one API method, following the leader and retrying transient failures."""
        deadline = time.monotonic() + self.retry_deadline_s
        url = self._leader or self._rotate()
        backoff = 0.02
        last_problem = "no attempt"
        redirects = 0
        self.auth.check()
        while True:
            try:
                async with self._http().post(
                    f"{url}/v1/{method}",
                    json=body,
                    headers=self.auth.headers(),
                    timeout=aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s),
                ) as resp:
                    status = resp.status
                    try:
                        data = await resp.json(content_type=None)
                    except ValueError:
                        data = {"error": "METADATA_ERROR", "message": f"HTTP {status}: not JSON"}
            except aiohttp.ClientConnectorCertificateError as exc:
                # Retrying cannot help: the CA this client trusts did not sign the controller's
                # certificate (or the certificate does not name the host called).
                raise ControllerAuthenticationError(
                    f"{method}: the controller at {url} is not trusted: {exc.certificate_error}; the client "
                    "verifies it against security.controller_ca_file (or tls.ca_file, or "
                    "AUTOMQ_CONTROLLER_CA_FILE): give it the CA that signed the controller's certificate"
                ) from exc
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                last_problem = f"{url}: {type(exc).__name__}: {exc}"
                if isinstance(exc, aiohttp.ClientSSLError) or "WRONG_VERSION_NUMBER" in str(exc):
                    last_problem += " (an https:// URL to a controller serving plain http? see security.controller_tls)"
                self._leader = None
                url = self._rotate()
            else:
                if status == 200:
                    self._leader = url
                    return data
                code = data.get("error") if isinstance(data, dict) else None
                if code == NotControllerError.code:
                    self._leader = None
                    leader = data.get("leader_url")
                    last_problem = f"{url}: {data.get('message')}"
                    if leader:
                        leader = same_scheme(leader.rstrip("/"), url)
                    if leader and leader != url and redirects < 3:
                        redirects += 1
                        url = leader
                        continue
                    url = self._rotate()
                elif status >= 500 and code in (None, "METADATA_ERROR"):
                    last_problem = f"{url}: HTTP {status}: {data}"
                    url = self._rotate()
                else:
                    cls = CLUSTER_ERRORS_BY_CODE.get(code or "", MetadataError)
                    raise cls(str(data.get("message", data)))
            redirects = 0
            if time.monotonic() + backoff > deadline:
                raise ControllerUnavailableError(
                    f"{method}: no active controller answered within {self.retry_deadline_s}s ({last_problem})"
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.25)  # an election takes ~lease timeout; do not add much to it

    # ------------------------------------------------------------------ ClusterClient

    async def register_broker(
        self, node_id: int, endpoints: list[Endpoint], rack: str | None, lease: AckLease | None = None
    ) -> int:
        body = {"node_id": node_id, "endpoints": to_wire(list(endpoints)), "rack": rack}
        return (await self._call_leased("register_broker", body, lease))["node_epoch"]

    async def heartbeat(self, node_id: int, node_epoch: int, lease: AckLease | None = None) -> str:
        body = {"node_id": node_id, "node_epoch": node_epoch}
        return (await self._call_leased("heartbeat", body, lease))["state"]

    async def _call_leased(self, method: str, body: dict[str, Any], lease: AckLease | None) -> dict[str, Any]:
        """`lease`: ask for an acknowledgement lease and record what the controller granted,
        counted from before the request was sent (storage/ack_lease.py)."""
        if lease is not None:
            body["ack_lease_ms"] = lease.requested_ms
        sent_at = time.monotonic()
        data = await self.call(method, body)
        if lease is not None:
            lease.grant(sent_at, int(data.get("ack_lease_ms", 0)))
        return data

    async def unregister_broker(self, node_id: int, node_epoch: int) -> None:
        await self.call("unregister_broker", {"node_id": node_id, "node_epoch": node_epoch})

    async def watch_metadata(self, since_version: int, timeout_ms: int, node_id: int = -1) -> MetadataImage:
        body: dict[str, Any] = {"since_version": since_version, "timeout_ms": timeout_ms}
        if node_id >= 0:
            body["node_id"] = node_id
        data = await self.call("watch_metadata", body, timeout_s=timeout_ms / 1000 + self.request_timeout_s)
        return wire.metadata_image(data)

    async def await_applied(self, version: int, timeout_ms: int, topics: list[str] | None = None) -> dict[str, Any]:
        return await self.call(
            "await_applied",
            {"version": version, "timeout_ms": timeout_ms, "topics": list(topics or ())},
            timeout_s=timeout_ms / 1000 + self.request_timeout_s,
        )

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        return wire.topic_info(
            await self.call("create_topic", {"name": name, "partitions": partitions, "configs": dict(configs)})
        )

    async def delete_topic(self, name: str) -> None:
        await self.call("delete_topic", {"name": name})

    async def create_partitions(self, name: str, total_count: int) -> TopicInfo:
        return wire.topic_info(await self.call("create_partitions", {"name": name, "total_count": total_count}))

    async def alter_topic_configs(self, name: str, configs: dict[str, str | None]) -> None:
        await self.call("alter_topic_configs", {"name": name, "configs": dict(configs)})

    async def alter_group_configs(self, group_id: str, configs: dict[str, str | None]) -> None:
        await self.call("alter_group_configs", {"group_id": group_id, "configs": dict(configs)})

    async def create_acls(self, bindings: list[AclBinding]) -> list[tuple[str | None, str | None]]:
        """Per binding: (None, None) when stored (or already there), else (error code, message)."""
        data = await self.call("create_acls", {"bindings": to_wire(list(bindings))})
        return [(code, message) for code, message in data["results"]]

    async def delete_acls(
        self, filters: list[AclFilter]
    ) -> list[tuple[tuple[str | None, str | None], list[AclBinding]]]:
        """Per filter: its result and the bindings it matched (and deleted)."""
        data = await self.call("delete_acls", {"filters": to_wire(list(filters))})
        return [((res[0], res[1]), [AclBinding(**b) for b in matched]) for res, matched in data["results"]]

    async def alter_client_quotas(
        self, entries: list[tuple[list[tuple[str, str | None]], dict[str, float | None]]], validate_only: bool
    ) -> list[tuple[str | None, str | None]]:
        body = {
            "entries": [{"entity": [list(p) for p in entity], "ops": ops} for entity, ops in entries],
            "validate_only": validate_only,
        }
        data = await self.call("alter_client_quotas", body)
        return [(code, message) for code, message in data["results"]]

    async def reassign_partition(self, topic: str, partition: int, target_node_id: int) -> None:
        await self.call(
            "reassign_partition", {"topic": topic, "partition": partition, "target_node_id": target_node_id}
        )

    async def partition_closed(
        self, topic: str, partition: int, node_id: int, node_epoch: int, leader_epoch: int
    ) -> None:
        await self.call(
            "partition_closed",
            {
                "topic": topic,
                "partition": partition,
                "node_id": node_id,
                "node_epoch": node_epoch,
                "leader_epoch": leader_epoch,
            },
        )

    async def drain_broker(self, node_id: int) -> None:
        await self.call("drain_broker", {"node_id": node_id})

    async def alter_scram_credentials(
        self, deletions: list[tuple[str, str]], upsertions: list[ScramCredentialInfo]
    ) -> dict[str, tuple[str, str] | None]:
        """{user: None (applied) | (Kafka error name, message)} (controller/users.py)."""
        data = await self.call(
            "alter_scram_credentials",
            {
                "deletions": [{"user": u, "mechanism": m} for u, m in deletions],
                "upsertions": [wire.to_wire(c) for c in upsertions],
            },
        )
        return {u: ((v[0], v[1]) if v else None) for u, v in data["results"].items()}

    async def create_delegation_token(self, token: DelegationTokenInfo) -> None:
        await self.call(
            "delegation_token",
            {
                "op": "create",
                "token_id": token.token_id,
                "owner": token.owner,
                "requester": token.requester,
                "renewers": list(token.renewers),
                "issue_ms": token.issue_ms,
                "expiry_ms": token.expiry_ms,
                "max_ms": token.max_ms,
            },
        )

    async def set_delegation_token_expiry(self, token_id: str, expiry_ms: int | None) -> bool:
        """Renew (new expiry, capped at the token's max) or remove (None); False: unknown token."""
        data = await self.call("delegation_token", {"op": "expiry", "token_id": token_id, "expiry_ms": expiry_ms})
        return bool(data["found"])

    async def undrain_broker(self, node_id: int) -> None:
        await self.call("undrain_broker", {"node_id": node_id})

    # ------------------------------------------------------------------ operator / recovery extras

    async def fence_broker(self, node_id: int) -> None:
        """Stop trusting a broker now (the operator saw its node die)."""
        await self.call("fence_broker", {"node_id": node_id})

    async def broker_sessions(self) -> dict[str, Any]:
        """{"brokers": [{node_id, node_epoch, state, heartbeat_age_ms}], "session_timeout_ms"}:
        what the active controller knows of each broker's heartbeats (None: no session yet)."""
        return await self.call("broker_sessions", {})

    async def list_wal_recovery_jobs(self) -> list[WalRecoveryJob]:
        data = await self.call("list_wal_recovery_jobs", {})
        return [wire.wal_recovery_job(j) for j in data["jobs"]]

    async def claim_wal_recovery(self, job_id: int, node_id: int = -1, node_epoch: int = -1) -> int:
        """Claim a fenced node's WAL (node_id/node_epoch: the claiming broker, or -1/-1 for the
        operator). Returns the recovery epoch: replay that WAL and commit as
        (job.node_id, recovery epoch), e.g. `storage.recovery.recover_wal(node_id=job.node_id,
        node_epoch=<it>)`; then `complete_wal_recovery`."""
        data = await self.call("claim_wal_recovery", {"job_id": job_id, "node_id": node_id, "node_epoch": node_epoch})
        return data["recovery_epoch"]

    async def complete_wal_recovery(self, job_id: int, node_id: int = -1, node_epoch: int = -1) -> None:
        await self.call("complete_wal_recovery", {"job_id": job_id, "node_id": node_id, "node_epoch": node_epoch})

    async def abandon_wal_recovery(self, job_id: int) -> None:
        await self.call("abandon_wal_recovery", {"job_id": job_id})

    async def status(self) -> dict[str, Any]:
        """`GET /v1/status` of the controller this client currently talks to."""
        url = self._leader or self.urls[0]
        async with self._http().get(
            f"{url}/v1/status", headers=self.auth.headers(), timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)
        ) as resp:
            return await resp.json()

    async def controller_status(self, url: str, timeout_s: float) -> dict[str, Any] | None:
        """`GET /v1/status` of one controller (any of `urls`); None when it does not answer."""
        try:
            async with self._http().get(
                f"{url.rstrip('/')}/v1/status",
                headers=self.auth.headers(),
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    # ------------------------------------------------------------------ StreamManager

    async def create_stream(self, tags: dict[str, str] | None = None) -> int:
        return (await self.call("create_stream", {"tags": dict(tags) if tags else None}))["stream_id"]

    async def open_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> StreamMetadata:
        data = await self.call(
            "open_stream", {"stream_id": stream_id, "epoch": epoch, "node_id": node_id, "node_epoch": node_epoch}
        )
        return wire.stream_metadata(data)

    async def close_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
        await self.call(
            "close_stream", {"stream_id": stream_id, "epoch": epoch, "node_id": node_id, "node_epoch": node_epoch}
        )

    async def trim_stream(
        self, stream_id: int, epoch: int, new_start_offset: int, node_id: int, node_epoch: int
    ) -> None:
        await self.call(
            "trim_stream",
            {
                "stream_id": stream_id,
                "epoch": epoch,
                "new_start_offset": new_start_offset,
                "node_id": node_id,
                "node_epoch": node_epoch,
            },
        )

    async def delete_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
        await self.call(
            "delete_stream", {"stream_id": stream_id, "epoch": epoch, "node_id": node_id, "node_epoch": node_epoch}
        )

    async def get_streams(self, stream_ids: list[int]) -> list[StreamMetadata]:
        data = await self.call("get_streams", {"stream_ids": list(stream_ids)})
        return [wire.stream_metadata(s) for s in data["streams"]]

    # ------------------------------------------------------------------ ObjectManager

    async def prepare_objects(self, count: int, ttl_ms: int) -> int:
        return (await self.call("prepare_objects", {"count": count, "ttl_ms": ttl_ms}))["first_object_id"]

    async def commit_stream_set_object(self, request: CommitStreamSetObjectRequest) -> None:
        # built by hand: this is the hottest request (one per upload) and to_wire is generic
        body = {
            "node_id": request.node_id,
            "node_epoch": request.node_epoch,
            "object_id": request.object_id,
            "object_size": request.object_size,
            "stream_ranges": [
                {
                    "stream_id": r.stream_id,
                    "epoch": r.epoch,
                    "start_offset": r.start_offset,
                    "end_offset": r.end_offset,
                    "size": r.size,
                }
                for r in request.stream_ranges
            ],
            "stream_objects": [_stream_object(o) for o in request.stream_objects],
            "compacted_object_ids": list(request.compacted_object_ids),
        }
        await self.call("commit_stream_set_object", body)

    async def commit_stream_object(self, obj: StreamObject, node_id: int, node_epoch: int) -> None:
        await self.call(
            "commit_stream_object", {"object": _stream_object(obj), "node_id": node_id, "node_epoch": node_epoch}
        )

    async def get_objects(self, stream_id: int, start_offset: int, end_offset: int, limit: int) -> list[ObjectMetadata]:
        data = await self.call(
            "get_objects",
            {"stream_id": stream_id, "start_offset": start_offset, "end_offset": end_offset, "limit": limit},
        )
        return [wire.object_metadata(o) for o in data["objects"]]

    async def get_stream_set_objects(self, node_id: int | None = None) -> list[ObjectMetadata]:
        data = await self.call("get_stream_set_objects", {"node_id": node_id})
        return [wire.object_metadata(o) for o in data["objects"]]
