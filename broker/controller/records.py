"""Metadata records: the only way controller state changes.

Every change the controller makes is one of these records, appended to the metadata log
(`log.py`) and applied by `MetadataState.apply` (`state.py`) on the leader and on every
standby alike. Records therefore carry every value that is not a pure function of the
state before them (the time, a fresh topic UUID), so replaying a log always rebuilds the
same state. Fields are JSON-native (int, str, None, lists, dicts) because a record is
written to the log exactly as `record_to_json` returns it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

RECORD_TYPES: dict[str, type[Record]] = {}


@dataclass(frozen=True, slots=True)
class Record:
    TYPE: ClassVar[str] = ""
    # True for records that change what `watch_metadata` reports (brokers, topics,
    # partitions, recovery jobs): they bump the metadata version brokers long-poll on.
    VISIBLE: ClassVar[bool] = False


_R = TypeVar("_R", bound=type[Record])


def _record(name: str, visible: bool = False) -> Callable[[_R], _R]:
    def wrap(cls: _R) -> _R:
        cls.TYPE = name
        cls.VISIBLE = visible
        RECORD_TYPES[name] = cls
        return cls

    return wrap


def is_visible(record: Record) -> bool:
    """Whether `record` changes the image brokers follow (bumps the metadata version)."""
    # A compaction swap too: leaders learn the rewritten range (PartitionInfo.compacted_end)
    # and stop serving its old batches from their log caches.
    return record.VISIBLE or (isinstance(record, StreamObjectCommitted) and bool(record.source_object_ids))


class RecordFormatError(ValueError):
    """A log entry holds something that is not a known record (corruption or a newer writer)."""


def record_to_json(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"type": record.TYPE}
    for f in fields(record):
        out[f.name] = getattr(record, f.name)
    return out


def record_from_json(data: dict[str, Any]) -> Record:
    try:
        cls = RECORD_TYPES[data["type"]]
        return cls(**{k: v for k, v in data.items() if k != "type"})
    except (KeyError, TypeError) as exc:
        raise RecordFormatError(f"not a metadata record: {str(data)[:200]}") from exc


# --------------------------------------------------------------------------- controller


@_record("controller_elected")
@dataclass(frozen=True, slots=True)
class ControllerElected(Record):
    """Written by a controller that takes over; its conditional create is the election."""

    controller_id: int
    url: str
    term: int
    at_ms: int


@_record("controller_resigned")
@dataclass(frozen=True, slots=True)
class ControllerResigned(Record):
    """A leader shutting down gracefully: standbys may take over without waiting."""

    controller_id: int
    term: int


@_record("leader_heartbeat")
@dataclass(frozen=True, slots=True)
class LeaderHeartbeat(Record):
    """Written by an idle leader so standbys see it is alive (log-based leadership)."""

    term: int
    at_ms: int


@_record("cluster_initialized", visible=True)
@dataclass(frozen=True, slots=True)
class ClusterInitialized(Record):
    cluster_id: str


# --------------------------------------------------------------------------- brokers


@_record("broker_registered", visible=True)
@dataclass(frozen=True, slots=True)
class BrokerRegistered(Record):
    node_id: int
    node_epoch: int
    endpoints: list[list[Any]]  # [[listener, host, port], ...]
    rack: str | None
    at_ms: int


@_record("broker_state_changed", visible=True)
@dataclass(frozen=True, slots=True)
class BrokerStateChanged(Record):
    node_id: int
    state: str  # "active" | "fenced" | "draining"


# --------------------------------------------------------------------------- topics


@_record("topic_created", visible=True)
@dataclass(frozen=True, slots=True)
class TopicCreated(Record):
    name: str
    topic_id: str
    configs: dict[str, str]


@_record("topic_deleted", visible=True)
@dataclass(frozen=True, slots=True)
class TopicDeleted(Record):
    name: str


@_record("topic_configs_altered", visible=True)
@dataclass(frozen=True, slots=True)
class TopicConfigsAltered(Record):
    name: str
    configs: dict[str, str | None]  # key -> value, or None to remove


@_record("partition_created", visible=True)
@dataclass(frozen=True, slots=True)
class PartitionCreated(Record):
    topic: str
    partition: int
    stream_id: int
    leader: int
    leader_epoch: int
    state: str


@_record("partition_changed", visible=True)
@dataclass(frozen=True, slots=True)
class PartitionChanged(Record):
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    state: str  # "online" | "moving" | "offline"
    target: int = -1


# --------------------------------------------------------------------------- streams


@_record("stream_created")
@dataclass(frozen=True, slots=True)
class StreamCreated(Record):
    stream_id: int
    tags: dict[str, Any] = field(default_factory=dict)


@_record("stream_opened")
@dataclass(frozen=True, slots=True)
class StreamOpened(Record):
    stream_id: int
    epoch: int
    node_id: int


@_record("stream_closed")
@dataclass(frozen=True, slots=True)
class StreamClosed(Record):
    stream_id: int


@_record("stream_trimmed")
@dataclass(frozen=True, slots=True)
class StreamTrimmed(Record):
    stream_id: int
    start_offset: int
    at_ms: int


@_record("stream_deleted")
@dataclass(frozen=True, slots=True)
class StreamDeleted(Record):
    stream_id: int
    at_ms: int


# --------------------------------------------------------------------------- objects


@_record("objects_prepared")
@dataclass(frozen=True, slots=True)
class ObjectsPrepared(Record):
    first_object_id: int
    count: int
    expires_at_ms: int


@_record("stream_set_object_committed")
@dataclass(frozen=True, slots=True)
class StreamSetObjectCommitted(Record):
    """A fresh upload (advances stream end offsets) or, with `compacted_object_ids`, a
    compaction swap (offsets unchanged, sources marked for deletion)."""

    object_id: int  # -1: no stream-set object, only stream objects
    object_size: int
    node_id: int
    ranges: list[list[int]]  # [[stream_id, start, end], ...]
    stream_objects: list[list[int]]  # [[object_id, size, stream_id, start, end], ...]
    compacted_object_ids: list[int]
    at_ms: int


@_record("stream_object_committed")
@dataclass(frozen=True, slots=True)
class StreamObjectCommitted(Record):
    """A fresh stream object (advances the end offset) or, with sources, a compaction."""

    object_id: int
    object_size: int
    stream_id: int
    start_offset: int
    end_offset: int
    source_object_ids: list[int]
    node_id: int
    at_ms: int


@_record("objects_marked_for_deletion")
@dataclass(frozen=True, slots=True)
class ObjectsMarkedForDeletion(Record):
    """Expired prepared ids (and anything else dead) become garbage."""

    object_ids: list[int]
    at_ms: int


@_record("objects_destroyed")
@dataclass(frozen=True, slots=True)
class ObjectsDestroyed(Record):
    """The garbage collector deleted these keys from the object store."""

    object_ids: list[int]


# --------------------------------------------------------------------------- WAL recovery


@_record("wal_recovery_job_created", visible=True)
@dataclass(frozen=True, slots=True)
class WalRecoveryJobCreated(Record):
    job_id: int
    node_id: int
    node_epoch: int
    stream_ids: list[int]
    at_ms: int


@_record("wal_recovery_job_claimed", visible=True)
@dataclass(frozen=True, slots=True)
class WalRecoveryJobClaimed(Record):
    """The claimer recovers the fenced node's WAL and commits *as that node* under
    `recovery_epoch`, a node epoch above every one the node used (the node stays fenced)."""

    job_id: int
    node_id: int  # the claimer (-1: the operator)
    recovery_epoch: int = -1


@_record("wal_recovery_job_released", visible=True)
@dataclass(frozen=True, slots=True)
class WalRecoveryJobReleased(Record):
    job_id: int


@_record("wal_recovery_job_cancelled", visible=True)
@dataclass(frozen=True, slots=True)
class WalRecoveryJobCancelled(Record):
    """The fenced node registered again and recovers its own WAL: drop the job, leave its
    streams open to it so its recovery commits are accepted."""

    job_id: int


@_record("wal_recovery_job_completed", visible=True)
@dataclass(frozen=True, slots=True)
class WalRecoveryJobCompleted(Record):
    """Closes every stream the fenced node still held open, then drops the job."""

    job_id: int


# --------------------------------------------------------------------------- ACLs and client quotas


@_record("acls_created", visible=True)
@dataclass(frozen=True, slots=True)
class AclsCreated(Record):
    """New bindings (see `acls.AclBinding`), each as its 7 fields in declaration order."""

    bindings: list[list[Any]]


@_record("acls_deleted", visible=True)
@dataclass(frozen=True, slots=True)
class AclsDeleted(Record):
    bindings: list[list[Any]]


@_record("group_configs_altered", visible=True)
@dataclass(frozen=True, slots=True)
class GroupConfigsAltered(Record):
    """Per-group dynamic configs (ConfigResource type GROUP; keys in group_configs.py)."""

    group_id: str
    configs: dict[str, str | None]  # key -> value, or None to remove


@_record("client_quotas_altered", visible=True)
@dataclass(frozen=True, slots=True)
class ClientQuotasAltered(Record):
    entity: list[list[Any]]  # [[type, name or None], ...] sorted by type
    ops: dict[str, float | None]  # key -> value, or None to remove


# --------------------------------------------------------------------------- SCRAM users (issue 15)


@_record("scram_credential_upserted", visible=True)
@dataclass(frozen=True, slots=True)
class ScramCredentialUpserted(Record):
    """A user's SCRAM credential: salt and keys (base64), never the password."""

    user: str
    mechanism: str  # "SCRAM-SHA-256" | "SCRAM-SHA-512"
    salt: str
    iterations: int
    stored_key: str
    server_key: str


@_record("scram_credential_deleted", visible=True)
@dataclass(frozen=True, slots=True)
class ScramCredentialDeleted(Record):
    user: str
    mechanism: str


# --------------------------------------------------------------------------- delegation tokens (issue 15)


@_record("delegation_token_created", visible=True)
@dataclass(frozen=True, slots=True)
class DelegationTokenCreated(Record):
    """A delegation token's metadata; its HMAC is never stored (brokers derive it from the
    shared secret key and the token id, as Kafka's)."""

    token_id: str
    owner: str  # "User:alice"
    requester: str
    renewers: list[str]
    issue_ms: int
    expiry_ms: int
    max_ms: int


@_record("delegation_token_renewed", visible=True)
@dataclass(frozen=True, slots=True)
class DelegationTokenRenewed(Record):
    token_id: str
    expiry_ms: int


@_record("delegation_token_removed", visible=True)
@dataclass(frozen=True, slots=True)
class DelegationTokenRemoved(Record):
    token_id: str


# --------------------------------------------------------------------------- schema registry


@_record("schema_registered")
@dataclass(frozen=True, slots=True)
class SchemaRegistered(Record):
    """A subject's new version. The schema id is global: a schema already known under any
    subject keeps its id (the record repeats its text so a log alone rebuilds the state)."""

    subject: str
    version: int
    schema_id: int
    schema_type: str  # AVRO | JSON | PROTOBUF (stored as its base64 FileDescriptorProto)
    schema: str
    references: list[dict[str, Any]]  # [{"name", "subject", "version"}]


@_record("schema_version_deleted")
@dataclass(frozen=True, slots=True)
class SchemaVersionDeleted(Record):
    """Soft (the version stays readable with deleted=true) or permanent (it is gone)."""

    subject: str
    version: int
    permanent: bool


@_record("schema_config_set")
@dataclass(frozen=True, slots=True)
class SchemaConfigSet(Record):
    subject: str | None  # None: the global level
    compatibility: str | None  # None: removed (the subject falls back to the global level)
