"""What brokers and the operator ask of the controller about the cluster (not storage).

`ClusterClient` is implemented by `automq.broker.controller.client.ControllerClient` over the
controller's HTTP API (which also implements the storage contract in
`automq.broker.storage.metadata`). Brokers, local mode and the operator use only these names.

How partition leadership flows
------------------------------
The controller places each partition on a broker (`PartitionInfo.leader`) under a
`leader_epoch` that grows on every move; the partition's stream is opened with
stream epoch = leader epoch, so a new leader fences the old one at the storage layer too.
Brokers follow `watch_metadata(since_version)` (a long poll that returns as soon as the
metadata version passes `since_version`), open streams for partitions they now lead and
close the ones they lost. A graceful move (reassignment, drain) is: the controller marks the
partition `moving`; the old leader closes its stream (uploading what it holds) and calls
`partition_closed`; the controller sets the new leader with a higher epoch; the new leader
opens. A fenced broker's partitions move only after its WAL was recovered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from automq.broker.controller.acls import AclBinding, AclFilter
from automq.broker.controller.quotas import ClientQuota
from automq.broker.storage.metadata import ERRORS_BY_CODE, MetadataError


class TopicExistsError(MetadataError):
    code = "TOPIC_ALREADY_EXISTS"


class UnknownTopicError(MetadataError):
    code = "UNKNOWN_TOPIC_OR_PARTITION"


class InvalidPartitionsError(MetadataError):
    code = "INVALID_PARTITIONS"


class InvalidConfigError(MetadataError):
    code = "INVALID_CONFIG"


class BrokerNotAvailableError(MetadataError):
    code = "BROKER_NOT_AVAILABLE"


class InvalidTopicError(MetadataError):
    """The topic name breaks Kafka's rules (characters, length, '.'/'..')."""

    code = "INVALID_TOPIC_EXCEPTION"


class ReassignmentInProgressError(MetadataError):
    """The partition is already moving; wait for that move to finish."""

    code = "REASSIGNMENT_IN_PROGRESS"


class WalRecoveryPendingError(MetadataError):
    """The stream's owner was fenced and its WAL is not recovered yet; the stream reopens
    only after the recovery job completed."""

    code = "WAL_RECOVERY_PENDING"


class WalRecoveryJobError(MetadataError):
    """The WAL recovery job does not exist, or is claimed by another node."""

    code = "INVALID_WAL_RECOVERY_JOB"


class ObjectConflictError(MetadataError):
    """A compaction's source objects are no longer live (another compaction or a trim won),
    or its new objects do not cover exactly what the sources held."""

    code = "OBJECT_CONFLICT"


class ControllerUnavailableError(MetadataError):
    """No controller answered (all unreachable, or no leader elected) before the client's
    retry deadline."""

    code = "CONTROLLER_UNAVAILABLE"


class ControllerAuthenticationError(MetadataError):
    """The controller API refused the call: no or a wrong token / client certificate
    (security.controller_token_file, security.controller_tls). Not retried."""

    code = "CONTROLLER_AUTHENTICATION_FAILED"


class InvalidRequestError(MetadataError):
    """The request is malformed (missing field, wrong type, negative count...)."""

    code = "INVALID_REQUEST"


@dataclass(frozen=True, slots=True)
class Endpoint:
    listener: str
    host: str
    port: int


# A broker registers its HTTP endpoint (/metrics, /healthz) under this listener name after its
# Kafka listeners, so the balancer finds every broker's metrics in the controller's registry.
METRICS_LISTENER = "AUTOMQ_HTTP"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    node_epoch: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None = None
    state: str = "active"  # "active" | "fenced" | "draining"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    stream_id: int
    leader: int  # node id, -1 while none is placed / during a move
    leader_epoch: int
    state: str = "online"  # "online" | "moving" | "offline"
    target: int = -1  # node id a move is heading to
    # Offsets below this were rewritten by a compaction (key compaction drops records): a leader
    # must stop serving them from its log cache, which still holds the batches it appended.
    compacted_end: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str  # 16-byte UUID as a string, as Kafka's Metadata v10+ reports it
    partitions: tuple[PartitionInfo, ...]
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WalRecoveryJob:
    """A fenced broker held open streams: its WAL may hold acknowledged data that is not in
    objects yet. A live broker (S3 WAL, or a volume it can reach) or the operator claims the
    job, replays that WAL, commits on the fenced owner's behalf, and completes the job; only
    then do the partitions reopen elsewhere under a new epoch."""

    job_id: int
    node_id: int  # the fenced broker whose WAL needs recovery
    node_epoch: int  # its node epoch when fenced (WAL objects/headers carry it)
    state: str = "pending"  # "pending" | "claimed"
    claimed_by: int = -1
    stream_ids: tuple[int, ...] = ()  # streams it still held open
    # while claimed: commit as (node_id, recovery_epoch), e.g. storage.recovery.recover_wal
    recovery_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    """A SCRAM credential as brokers need it to authenticate (base64 fields; no password)."""

    user: str
    mechanism: str  # "SCRAM-SHA-256" | "SCRAM-SHA-512"
    salt: str
    iterations: int
    stored_key: str
    server_key: str


@dataclass(frozen=True, slots=True)
class GroupConfigs:
    """A group's dynamic configs (ConfigResource type GROUP), only the keys set on it."""

    group_id: str
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class DelegationTokenInfo:
    """A delegation token as brokers need it (no HMAC: derived from the shared secret key)."""

    token_id: str
    owner: str
    requester: str
    renewers: tuple[str, ...]
    issue_ms: int
    expiry_ms: int
    max_ms: int


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """A consistent view of the cluster at one metadata version."""

    version: int
    cluster_id: str
    controller_id: int
    brokers: tuple[BrokerInfo, ...]
    topics: tuple[TopicInfo, ...]
    # added after the first contract; defaulted so older constructors still work
    wal_recovery_jobs: tuple[WalRecoveryJob, ...] = ()
    acls: tuple[AclBinding, ...] = ()
    client_quotas: tuple[ClientQuota, ...] = ()
    scram_credentials: tuple[ScramCredentialInfo, ...] = ()
    group_configs: tuple[GroupConfigs, ...] = ()
    delegation_tokens: tuple[DelegationTokenInfo, ...] = ()


@runtime_checkable
class ClusterClient(Protocol):
    async def register_broker(self, node_id: int, endpoints: list[Endpoint], rack: str | None) -> int:
        """Join (or rejoin) the cluster; returns the new node epoch, higher than any before."""

    async def heartbeat(self, node_id: int, node_epoch: int) -> str:
        """Keep the session alive; returns the broker state the controller holds
        ("active" | "draining"). Raises NodeFencedError when the epoch is stale."""

    async def unregister_broker(self, node_id: int, node_epoch: int) -> None:
        """Graceful shutdown: the controller moves this broker's partitions elsewhere."""

    async def watch_metadata(self, since_version: int, timeout_ms: int, node_id: int = -1) -> MetadataImage:
        """The current image as soon as its version > since_version, or after timeout_ms. A
        broker passes its node id: watching from a version says it has applied it."""

    async def await_applied(self, version: int, timeout_ms: int, topics: list[str] | None = None) -> dict[str, Any]:
        """Wait (up to timeout_ms) until every live broker applied `version` and the partitions
        of `topics` are open on their leaders; returns {"laggards": [...], "unopened": [...]}."""

    async def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo: ...

    async def delete_topic(self, name: str) -> None: ...

    async def create_partitions(self, name: str, total_count: int) -> TopicInfo: ...

    async def alter_topic_configs(self, name: str, configs: dict[str, str | None]) -> None:
        """Set keys to values; a None value removes the key (back to the broker default)."""

    async def reassign_partition(self, topic: str, partition: int, target_node_id: int) -> None:
        """Start a graceful move (see module docstring). Returns once it is started."""

    async def partition_closed(
        self, topic: str, partition: int, node_id: int, node_epoch: int, leader_epoch: int
    ) -> None:
        """The old leader has closed the stream of a moving partition."""

    async def drain_broker(self, node_id: int) -> None:
        """Move all partitions off a broker and place no new ones on it (scale-in, rolling restart)."""

    async def undrain_broker(self, node_id: int) -> None: ...

    async def controller_status(self, url: str, timeout_s: float) -> dict[str, Any] | None:
        """One controller's status (role, term, log position), None when it does not answer."""

    async def create_acls(self, bindings: list[AclBinding]) -> list[tuple[str | None, str | None]]:
        """Per binding: (None, None) when stored (or already there), else (error code, message)."""

    async def delete_acls(
        self, filters: list[AclFilter]
    ) -> list[tuple[tuple[str | None, str | None], list[AclBinding]]]:
        """Per filter: its (error code, message) and the bindings it matched and deleted."""

    async def alter_client_quotas(
        self, entries: list[tuple[list[tuple[str, str | None]], dict[str, float | None]]], validate_only: bool
    ) -> list[tuple[str | None, str | None]]:
        """Per entry (entity pairs, key -> value or None to remove): (error code, message)."""

    async def alter_group_configs(self, group_id: str, configs: dict[str, str | None]) -> None:
        """Set (value) or remove (None) a group's dynamic configs; InvalidConfigError if bad."""


# Every error code the controller API can return (storage contract + cluster ones).
CLUSTER_ERRORS_BY_CODE: dict[str, type[MetadataError]] = {
    **ERRORS_BY_CODE,
    **{
        cls.code: cls
        for cls in (
            TopicExistsError,
            UnknownTopicError,
            InvalidPartitionsError,
            InvalidConfigError,
            BrokerNotAvailableError,
            InvalidTopicError,
            ReassignmentInProgressError,
            WalRecoveryPendingError,
            WalRecoveryJobError,
            ObjectConflictError,
            InvalidRequestError,
            ControllerUnavailableError,
            ControllerAuthenticationError,
        )
    },
}
