"""Kafka topic configs: which keys exist here, their defaults, validation, and how
DescribeConfigs reports them (sources, synonyms, types, read-only flags) — one place.

A topic stores only the keys a user set (`TopicInfo.configs`, Kafka's "dynamic topic
config"); every other key falls back to the broker default, which comes from
`NodeConfig.kafka` when the broker config has a field for it (`log.retention.ms` ->
`kafka.log_retention_ms`) and from Kafka's own default otherwise.

Decisions worth knowing (also in docs/configuration.md, generated from `TOPIC_CONFIGS`):
- `cleanup.policy=compact` topics are compacted by the Spark key-compaction job
  (`automq spark compact --keys`, docs/spark.md) when it runs; between runs the topic keeps
  every record. Kafka promises compaction eventually and never when, so readers of a compacted
  topic already handle superseded values. Time/size retention applies only when the policy
  contains `delete`.
- Segment, flush, index and replication-throttle keys are accepted and have no effect:
  there are no local segments (data lives in the WAL and the object store).
- `min.insync.replicas` is accepted: a partition has one replica and acks=all waits for the
  WAL sync, which is this system's durability point.

Error messages follow a Java broker's wording so tools and people recognise them:
"Unknown topic config name: x", "Invalid value v for configuration k: reason".
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.config import kafka_name

if TYPE_CHECKING:
    from automq.broker.config import NodeConfig

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


class ConfigType(enum.IntEnum):
    """DescribeConfigs v3+ `config_type`."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(enum.IntEnum):
    """DescribeConfigs `config_source` and synonym `source`."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    GROUP_CONFIG = 8  # a group config set on the group (group_configs.py)


class ConfigResourceType(enum.IntEnum):
    """ConfigResource.Type as DescribeConfigs/AlterConfigs carry it."""

    UNKNOWN = 0
    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class AlterConfigOp(enum.IntEnum):
    """IncrementalAlterConfigs `config_operation`."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class TopicConfigError(Exception):
    """A topic config key or value is not acceptable; the message names the key."""

    def __init__(self, message: str, error_code: ErrorCode = ErrorCode.invalid_config) -> None:
        super().__init__(message)
        self.error_code = error_code


# --------------------------------------------------------------------------- value checks
# Each check parses a string value, raises ValueError(reason) in Kafka's words, and returns
# the canonical string to store.


def _number(kind: str, lo: int, hi: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            n = int(value.strip())
        except ValueError:
            raise ValueError(f"Not a number of type {kind}") from None
        if not -(1 << 63) <= n <= LONG_MAX or (kind == "INT" and not -(1 << 31) <= n <= INT_MAX):
            raise ValueError(f"Not a number of type {kind}")
        if n < lo:
            raise ValueError(f"Value must be at least {lo}")
        if n > hi:
            raise ValueError(f"Value must be no more than {hi}")
        return str(n)

    return check


def _long(lo: int = -(1 << 63), hi: int = LONG_MAX) -> Callable[[str], str]:
    return _number("LONG", lo, hi)


def _int(lo: int = -(1 << 31), hi: int = INT_MAX) -> Callable[[str], str]:
    return _number("INT", lo, hi)


def _double(lo: float, hi: float) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            x = float(value.strip())
        except ValueError:
            raise ValueError("Not a number of type DOUBLE") from None
        if math.isnan(x) or x < lo or x > hi:
            raise ValueError(f"Value must be between {lo} and {hi}")
        return repr(x)

    return check


def _boolean(value: str) -> str:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise ValueError("Expected value to be either true or false")
    return v


def _one_of(*choices: str, case_sensitive: bool = True) -> Callable[[str], str]:
    def check(value: str) -> str:
        v = value.strip()
        for c in choices:
            if v == c or (not case_sensitive and v.lower() == c.lower()):
                return c
        raise ValueError(f"String must be one of: {', '.join(choices)}")

    return check


def _list_of(*choices: str, allow_empty: bool) -> Callable[[str], str]:
    def check(value: str) -> str:
        items = [i.strip() for i in value.split(",") if i.strip()]
        if not items and not allow_empty:
            raise ValueError("Value must not be empty")
        for item in items:
            if choices and item not in choices:
                raise ValueError(f"Invalid value {item} for a list of: {', '.join(choices)}")
        if len(set(items)) != len(items):
            raise ValueError("Values must not contain duplicates")
        return ",".join(items)

    return check


def _replica_list(value: str) -> str:
    """Kafka's throttled-replicas format: '*' or 'partition:broker,...'."""
    v = value.strip()
    if v in ("", "*"):
        return v
    for item in v.split(","):
        p, sep, b = item.strip().partition(":")
        if not sep or not p.isdigit() or not b.isdigit():
            raise ValueError("Must be '*' or a list of 'partitionId:brokerId'")
    return ",".join(i.strip() for i in v.split(","))


# --------------------------------------------------------------------------- table topics
# `automq.table.*`: which topics the lake ingestion job (automq.spark.ingest) writes to
# Iceberg, and how. The broker only stores and validates them; docs/spark.md explains them.

TABLE_PREFIX = "automq.table.topic."
PARTITION_TRANSFORMS = ("identity", "year", "month", "day", "hour", "bucket", "truncate", "void")
_PARTITION_ITEM = re.compile(r"\s*(?:(\w+)\s*\(\s*([\w.]+)\s*(?:,\s*(\d+)\s*)?\)|([\w.]+))\s*")
_COLUMN_LIST = re.compile(r"[A-Za-z_][\w.]*")


def parse_partition_by(value: str) -> list[tuple[str, str, int | None]]:
    """`day(timestamp), bucket(id, 16), region` -> [(transform, column, argument)].
    ValueError naming the bad item. Columns are checked against the table by the job."""
    items: list[tuple[str, str, int | None]] = []
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(value + ","):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(value[start:i])
            start = i + 1
    for part in parts:
        if not part.strip():
            continue
        m = _PARTITION_ITEM.fullmatch(part)
        if m is None:
            raise ValueError(f"cannot parse partition item {part.strip()!r}: use column or transform(column[, n])")
        transform, column, arg, bare = m.groups()
        if bare:
            items.append(("identity", bare, None))
            continue
        transform = transform.lower()
        if transform not in PARTITION_TRANSFORMS:
            raise ValueError(f"unknown partition transform {transform!r} (one of {', '.join(PARTITION_TRANSFORMS)})")
        if (transform in ("bucket", "truncate")) != (arg is not None):
            raise ValueError(
                f"{transform}(column, n) takes a number" if arg is None else f"{transform} takes no number"
            )
        if arg is not None and int(arg) <= 0:
            raise ValueError(f"{transform} needs a positive number")
        items.append((transform, column, int(arg) if arg is not None else None))
    return items


def _partition_by(value: str) -> str:
    items = parse_partition_by(value)
    return ", ".join(f"{t}({c}, {a})" if a else (c if t == "identity" else f"{t}({c})") for t, c, a in items)


def _column_list(value: str) -> str:
    cols = [c.strip() for c in value.split(",") if c.strip()]
    for c in cols:
        if not _COLUMN_LIST.fullmatch(c):
            raise ValueError(f"{c!r} is not a column name")
    return ",".join(cols)


def _subject(value: str) -> str:
    v = value.strip()
    if len(v) > 1_000 or any(ord(c) < 32 for c in v):
        raise ValueError("a schema registry subject: at most 1000 characters, no control characters")
    return v


def _message_name(value: str) -> str:
    v = value.strip().removeprefix(".")
    if v and not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", v):
        raise ValueError("a Protobuf message's full name such as 'shop.v1.Order', or empty")
    return v


def _namespace(value: str) -> str:
    v = value.strip()
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", v):
        raise ValueError("must be dot-separated identifiers such as 'lake' or 'lake.kafka'")
    return v


# --------------------------------------------------------------------------- the keys


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    name: str
    type: ConfigType
    default: str  # Kafka's default, used when the broker config has no field for broker_key
    check: Callable[[str], str]
    doc: str
    effect: str  # what this system does with the key (the docs table shows it)
    broker_key: str | None = None  # the broker-level synonym, e.g. "log.retention.ms"

    @property
    def node_field(self) -> str | None:
        """The `NodeConfig.kafka` field holding the broker default, by Kafka's naming rule."""
        return self.broker_key.replace(".", "_") if self.broker_key else None


_NO_SEGMENTS = "accepted, no effect: there are no local segments (data lives in the WAL and the object store)"
_NO_COMPACTION = "accepted, no effect: the key-compaction job cleans every cleanable record on each run"

TOPIC_CONFIGS: dict[str, TopicConfigKey] = {
    k.name: k
    for k in (
        TopicConfigKey(
            "cleanup.policy",
            ConfigType.LIST,
            "delete",
            # Kafka 4.x accepts an empty list (neither policy: the log is kept whole)
            _list_of("compact", "delete", allow_empty=True),
            "The retention policy: 'delete' discards old data by time/size, 'compact' keeps the latest value per key; "
            "empty: neither.",
            "delete: enforced by the retention task. compact: the Spark key-compaction job (automq spark compact "
            "--keys) keeps the latest record per key when it runs; retention applies only if the list also contains "
            "delete; an empty list keeps every record",
            broker_key="log.cleanup.policy",
        ),
        TopicConfigKey(
            "retention.ms",
            ConfigType.LONG,
            str(7 * 24 * 3_600_000),
            _long(lo=-1),
            "Discard record batches whose newest timestamp is older than this; -1 keeps data forever.",
            "enforced: the retention task trims the partition's stream (whole batches, oldest first)",
            broker_key="log.retention.ms",
        ),
        TopicConfigKey(
            "retention.bytes",
            ConfigType.LONG,
            "-1",
            _long(lo=-1),
            "Discard the oldest batches while the partition holds more than this many bytes; -1 = no limit.",
            "enforced: the retention task trims the partition's stream, in chunks of about 1 MiB",
            broker_key="log.retention.bytes",
        ),
        TopicConfigKey(
            "max.message.bytes",
            ConfigType.INT,
            "1048588",
            _int(lo=0),
            "The largest record batch the broker accepts for this topic.",
            "enforced by Produce (MESSAGE_TOO_LARGE)",
            broker_key="message.max.bytes",
        ),
        TopicConfigKey(
            "message.timestamp.type",
            ConfigType.STRING,
            "CreateTime",
            _one_of("CreateTime", "LogAppendTime"),
            "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches with the broker's clock.",
            "enforced by Produce (LogAppendTime rewrites each batch's timestamps)",
            broker_key="log.message.timestamp.type",
        ),
        TopicConfigKey(
            "message.timestamp.before.max.ms",
            ConfigType.LONG,
            str(LONG_MAX),
            _long(lo=0),
            "With CreateTime, reject batches whose timestamp is this much older than the broker's clock.",
            "accepted, not enforced: Produce does not reject batches for their timestamps",
            broker_key="log.message.timestamp.before.max.ms",
        ),
        TopicConfigKey(
            "message.timestamp.after.max.ms",
            ConfigType.LONG,
            "3600000",
            _long(lo=0),
            "With CreateTime, reject batches whose timestamp is this much ahead of the broker's clock.",
            "accepted, not enforced: Produce does not reject batches for their timestamps",
            broker_key="log.message.timestamp.after.max.ms",
        ),
        TopicConfigKey(
            "compression.type",
            ConfigType.STRING,
            "producer",
            _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
            "The final compression of the topic's data; 'producer' keeps what the producer sent.",
            "accepted; batches are always stored as the producer sent them (no broker-side recompression)",
            broker_key="compression.type",
        ),
        TopicConfigKey(
            "compression.gzip.level",
            ConfigType.INT,
            "-1",
            _int(lo=-1, hi=9),
            "gzip level for broker-side recompression.",
            "accepted, no effect: no broker-side recompression",
            broker_key="compression.gzip.level",
        ),
        TopicConfigKey(
            "compression.lz4.level",
            ConfigType.INT,
            "9",
            _int(lo=1, hi=17),
            "lz4 level for broker-side recompression.",
            "accepted, no effect: no broker-side recompression",
            broker_key="compression.lz4.level",
        ),
        TopicConfigKey(
            "compression.zstd.level",
            ConfigType.INT,
            "3",
            _int(lo=-131072, hi=22),
            "zstd level for broker-side recompression.",
            "accepted, no effect: no broker-side recompression",
            broker_key="compression.zstd.level",
        ),
        TopicConfigKey(
            "min.insync.replicas",
            ConfigType.INT,
            "1",
            _int(lo=1),
            "Replicas that must acknowledge an acks=all write.",
            "accepted: a partition has one replica and acks=all waits for the WAL to be durable",
            broker_key="min.insync.replicas",
        ),
        TopicConfigKey(
            "segment.bytes",
            ConfigType.INT,
            str(1 << 30),
            _int(lo=1 << 20),
            "Size of a log segment file.",
            _NO_SEGMENTS,
            broker_key="log.segment.bytes",
        ),
        TopicConfigKey(
            "segment.ms",
            ConfigType.LONG,
            str(7 * 24 * 3_600_000),
            _long(lo=1),
            "Roll a new segment after this long.",
            _NO_SEGMENTS,
            broker_key="log.roll.ms",
        ),
        TopicConfigKey(
            "segment.jitter.ms",
            ConfigType.LONG,
            "0",
            _long(lo=0),
            "Random jitter subtracted from segment.ms.",
            _NO_SEGMENTS,
            broker_key="log.roll.jitter.ms",
        ),
        TopicConfigKey(
            "segment.index.bytes",
            ConfigType.INT,
            str(10 << 20),
            _int(lo=4),
            "Size of a segment's offset index.",
            _NO_SEGMENTS,
            broker_key="log.index.size.max.bytes",
        ),
        TopicConfigKey(
            "index.interval.bytes",
            ConfigType.INT,
            "4096",
            _int(lo=0),
            "Bytes between offset index entries.",
            _NO_SEGMENTS,
            broker_key="log.index.interval.bytes",
        ),
        TopicConfigKey(
            "preallocate",
            ConfigType.BOOLEAN,
            "false",
            _boolean,
            "Preallocate segment files.",
            _NO_SEGMENTS,
            broker_key="log.preallocate",
        ),
        TopicConfigKey(
            "file.delete.delay.ms",
            ConfigType.LONG,
            "60000",
            _long(lo=0),
            "Wait before deleting a segment file.",
            _NO_SEGMENTS,
            broker_key="log.segment.delete.delay.ms",
        ),
        TopicConfigKey(
            "flush.messages",
            ConfigType.LONG,
            str(LONG_MAX),
            _long(lo=1),
            "fsync after this many messages.",
            "accepted, no effect: every acknowledged write is already durable in the WAL",
            broker_key="log.flush.interval.messages",
        ),
        TopicConfigKey(
            "flush.ms",
            ConfigType.LONG,
            str(LONG_MAX),
            _long(lo=0),
            "fsync at least this often.",
            "accepted, no effect: every acknowledged write is already durable in the WAL",
            broker_key="log.flush.interval.ms",
        ),
        TopicConfigKey(
            "delete.retention.ms",
            ConfigType.LONG,
            "86400000",
            _long(lo=0),
            "How long tombstones of a compacted topic are kept.",
            "enforced by the key-compaction job (from the tombstone's timestamp)",
            broker_key="log.cleaner.delete.retention.ms",
        ),
        TopicConfigKey(
            "min.compaction.lag.ms",
            ConfigType.LONG,
            "0",
            _long(lo=0),
            "Minimum age before a record may be compacted.",
            "enforced by the key-compaction job",
            broker_key="log.cleaner.min.compaction.lag.ms",
        ),
        TopicConfigKey(
            "max.compaction.lag.ms",
            ConfigType.LONG,
            str(LONG_MAX),
            _long(lo=1),
            "Maximum age before a record must be compacted.",
            "met by scheduling the key-compaction job more often than this (each run cleans all it can)",
            broker_key="log.cleaner.max.compaction.lag.ms",
        ),
        TopicConfigKey(
            "min.cleanable.dirty.ratio",
            ConfigType.DOUBLE,
            "0.5",
            _double(0.0, 1.0),
            "Dirty ratio that triggers compaction.",
            _NO_COMPACTION,
            broker_key="log.cleaner.min.cleanable.ratio",
        ),
        TopicConfigKey(
            "unclean.leader.election.enable",
            ConfigType.BOOLEAN,
            "false",
            _boolean,
            "Allow out-of-sync replicas to become leader.",
            "accepted, no effect: one replica, and a new leader reads the same stream",
            broker_key="unclean.leader.election.enable",
        ),
        TopicConfigKey(
            "leader.replication.throttled.replicas",
            ConfigType.LIST,
            "",
            _replica_list,
            "Replicas throttled on the leader side during reassignment.",
            "accepted, no effect: a reassignment copies no data",
        ),
        TopicConfigKey(
            "follower.replication.throttled.replicas",
            ConfigType.LIST,
            "",
            _replica_list,
            "Replicas throttled on the follower side during reassignment.",
            "accepted, no effect: a reassignment copies no data",
        ),
        TopicConfigKey(
            "remote.storage.enable",
            ConfigType.BOOLEAN,
            "false",
            _boolean,
            "Tiered storage for this topic.",
            "accepted, no effect: all data already lives in the object store",
        ),
        TopicConfigKey(
            "local.retention.ms",
            ConfigType.LONG,
            "-2",
            _long(lo=-2),
            "Local-tier retention with tiered storage.",
            "accepted, no effect: there is no local tier",
            broker_key="log.local.retention.ms",
        ),
        TopicConfigKey(
            "local.retention.bytes",
            ConfigType.LONG,
            "-2",
            _long(lo=-2),
            "Local-tier retention with tiered storage.",
            "accepted, no effect: there is no local tier",
            broker_key="log.local.retention.bytes",
        ),
        TopicConfigKey(
            "automq.table.topic.enable",
            ConfigType.BOOLEAN,
            "false",
            _boolean,
            "Write this topic to an Apache Iceberg table (the lake ingestion job, `automq spark ingest`).",
            "enforced by the ingestion job: docs/spark.md",
        ),
        TopicConfigKey(
            "automq.table.topic.commit.interval.ms",
            ConfigType.LONG,
            "0",
            _long(lo=0),
            "Least time between two commits of the topic's table: an ingestion run sooner than this after the "
            "last commit skips the table.",
            "enforced by the ingestion job",
        ),
        TopicConfigKey(
            "automq.table.topic.namespace",
            ConfigType.STRING,
            "kafka",
            _namespace,
            "Iceberg namespace of the topic's table (the table is named after the topic).",
            "enforced by the ingestion job",
        ),
        TopicConfigKey(
            "automq.table.topic.convert.value.type",
            ConfigType.STRING,
            "raw",
            _one_of("raw", "string", "json", "by_schema_id", "by_latest_schema"),
            "How record values become columns: raw bytes, a UTF-8 string, JSON objects whose fields "
            "become columns (schema inferred and widened when new fields appear), or Avro through the schema "
            "registry (Avro, JSON Schema, Protobuf): by_schema_id (Confluent wire format, the writer schema by its "
            "id), by_latest_schema (bare Avro or Protobuf bodies, the latest schema of "
            "automq.table.topic.convert.value.subject).",
            "enforced by the ingestion job (docs/spark.md)",
        ),
        TopicConfigKey(
            "automq.table.topic.convert.value.subject",
            ConfigType.STRING,
            "",
            _subject,
            "The schema registry subject of by_latest_schema values; empty: <topic>-value.",
            "enforced by the ingestion job",
        ),
        TopicConfigKey(
            "automq.table.topic.convert.value.message.full.name",
            ConfigType.STRING,
            "",
            _message_name,
            "by_latest_schema with a Protobuf schema: the full name of the values' message type "
            "(e.g. shop.v1.Order); empty: the schema's first message.",
            "enforced by the ingestion job",
        ),
        TopicConfigKey(
            "automq.table.topic.transform.value.type",
            ConfigType.STRING,
            "none",
            _one_of("none", "flatten", "flatten_debezium"),
            "Transform of JSON values: none, flatten (nested objects become a_b columns), flatten_debezium "
            "(the `after` row of a Debezium envelope, deletes by `id.columns`).",
            "enforced by the ingestion job (needs convert.value.type=json)",
        ),
        TopicConfigKey(
            "automq.table.topic.id.columns",
            ConfigType.LIST,
            "",
            _column_list,
            "Columns identifying a row: with flatten_debezium the table keeps the latest row per id (upsert).",
            "enforced by the ingestion job",
        ),
        TopicConfigKey(
            "automq.table.topic.partition.by",
            ConfigType.LIST,
            "",
            _partition_by,
            "Iceberg partition spec, e.g. 'day(timestamp), bucket(id, 16)' (identity, year, month, day, hour, "
            "bucket(n), truncate(w), void).",
            "enforced by the ingestion job (a change evolves the table's partition spec at its next run)",
        ),
        TopicConfigKey(
            "automq.table.topic.errors.tolerance",
            ConfigType.STRING,
            "none",
            _one_of("none", "all"),
            "A record that cannot be converted: none = fail the run (nothing of it is committed), all = write "
            "it to the dead-letter table <table>_dlq and go on.",
            "enforced by the ingestion job",
        ),
    )
}


# --------------------------------------------------------------------------- validation


def validate_value(name: str, value: str | None) -> str:
    """The canonical string for one key's value; TopicConfigError naming the key otherwise."""
    key = TOPIC_CONFIGS.get(name)
    if key is None:
        raise TopicConfigError(f"Unknown topic config name: {name}")
    if value is None:
        raise TopicConfigError(f"Null value not supported for topic configs: {name}")
    try:
        return key.check(value)
    except ValueError as exc:
        raise TopicConfigError(f"Invalid value {value} for configuration {name}: {exc}") from None


def validate_topic_configs(configs: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """Validate configs given at topic creation or by AlterConfigs (a full replacement).
    Returns them canonicalised; the first bad key raises TopicConfigError."""
    result: dict[str, str] = {}
    for name, value in configs:
        if name in result:
            raise TopicConfigError(f"Duplicate topic config name: {name}", ErrorCode.invalid_request)
        result[name] = validate_value(name, value)
    check_consistency(result)
    return result


def check_consistency(configs: Mapping[str, str]) -> None:
    """Cross-key rules Kafka enforces at the topic level."""
    # Kafka rejects local retention larger than total retention; both default to "same as total".
    for local, total in (("local.retention.ms", "retention.ms"), ("local.retention.bytes", "retention.bytes")):
        if local in configs and total in configs:
            lv, tv = int(configs[local]), int(configs[total])
            if lv >= 0 and tv >= 0 and lv > tv:
                raise TopicConfigError(
                    f"Invalid value {lv} for configuration {local}: Value must not be more than {total} ({tv})"
                )


def apply_incremental(current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]]) -> dict[str, str | None]:
    """IncrementalAlterConfigs on a topic: the changes to send to the controller
    ({key: new value, or None to remove}). Raises TopicConfigError naming the first bad key."""
    seen: set[str] = set()
    result = dict(current)
    for name, op, value in ops:
        if name in seen:
            raise TopicConfigError(f"Error due to duplicate config keys: {name}", ErrorCode.invalid_request)
        seen.add(name)
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise TopicConfigError(f"Unknown topic config name: {name}")
        try:
            operation = AlterConfigOp(op)
        except ValueError:
            raise TopicConfigError(f"Unknown config operation {op} for {name}", ErrorCode.invalid_request) from None
        if operation is AlterConfigOp.SET:
            result[name] = validate_value(name, value)
        elif operation is AlterConfigOp.DELETE:
            result.pop(name, None)
        else:
            if key.type is not ConfigType.LIST:
                raise TopicConfigError(
                    f"Config value append/subtract is not allowed for config key: {name} (type {key.type.name})"
                )
            if value is None:
                raise TopicConfigError(f"Null value not supported for topic configs: {name}")
            present = [i for i in result.get(name, key.default).split(",") if i]
            given = [i.strip() for i in value.split(",") if i.strip()]
            if operation is AlterConfigOp.APPEND:
                items = present + [i for i in given if i not in present]
            else:
                items = [i for i in present if i not in given]
            result[name] = validate_value(name, ",".join(items))
    check_consistency({k: v for k, v in result.items() if v is not None})
    changes: dict[str, str | None] = {k: v for k, v in result.items() if current.get(k) != v}
    changes.update({k: None for k in current if k not in result})
    return changes


def replace_all(current: Mapping[str, str], configs: Iterable[tuple[str, str | None]]) -> dict[str, str | None]:
    """AlterConfigs (non-incremental) on a topic: the given set replaces the topic's configs;
    keys left out go back to the broker default. Returns the changes for the controller."""
    new = validate_topic_configs(configs)
    changes: dict[str, str | None] = {k: v for k, v in new.items() if current.get(k) != v}
    changes.update({k: None for k in current if k not in new})
    return changes


# --------------------------------------------------------------------------- defaults


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def broker_default(key: TopicConfigKey, node: NodeConfig) -> tuple[str, ConfigSource]:
    """A topic key's value when the topic does not set it, and where that value comes from."""
    field_name = key.node_field
    if field_name and field_name in type(node.kafka).model_fields:
        value = _render(getattr(node.kafka, field_name))
        explicit = field_name in node.kafka.model_fields_set
        return value, ConfigSource.STATIC_BROKER_CONFIG if explicit else ConfigSource.DEFAULT_CONFIG
    return key.default, ConfigSource.DEFAULT_CONFIG


def builtin_default(key: TopicConfigKey, node: NodeConfig) -> str:
    """The default before any config file: the node config model's default, else Kafka's."""
    field_name = key.node_field
    fields = type(node.kafka).model_fields
    if field_name and field_name in fields and fields[field_name].default is not None:
        return _render(fields[field_name].default)
    return key.default


@dataclass(frozen=True, slots=True)
class EffectiveTopicConfig:
    """The typed values the broker acts on for one topic (topic keys over broker defaults)."""

    cleanup_policy: frozenset[str]
    retention_ms: int
    retention_bytes: int
    max_message_bytes: int
    message_timestamp_type: str
    timestamp_before_max_ms: int
    timestamp_after_max_ms: int
    compression_type: str
    min_insync_replicas: int

    @property
    def deletes(self) -> bool:
        """Whether time/size retention applies (Kafka: only with the delete policy)."""
        return "delete" in self.cleanup_policy


def effective_config(topic_configs: Mapping[str, str], node: NodeConfig) -> EffectiveTopicConfig:
    def value(name: str) -> str:
        if name in topic_configs:
            try:
                return validate_value(name, topic_configs[name])
            except TopicConfigError:
                pass  # a value stored by an older version: fall back to the default
        return broker_default(TOPIC_CONFIGS[name], node)[0]

    return EffectiveTopicConfig(
        cleanup_policy=frozenset(i for i in value("cleanup.policy").split(",") if i),
        retention_ms=int(value("retention.ms")),
        retention_bytes=int(value("retention.bytes")),
        max_message_bytes=int(value("max.message.bytes")),
        message_timestamp_type=value("message.timestamp.type"),
        timestamp_before_max_ms=int(value("message.timestamp.before.max.ms")),
        timestamp_after_max_ms=int(value("message.timestamp.after.max.ms")),
        compression_type=value("compression.type"),
        min_insync_replicas=int(value("min.insync.replicas")),
    )


# --------------------------------------------------------------------------- DescribeConfigs


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One entry of a DescribeConfigs result, version-independent."""

    name: str
    value: str | None
    source: ConfigSource
    type: ConfigType
    read_only: bool = False
    is_sensitive: bool = False
    is_default: bool = False  # DescribeConfigs v0 only
    synonyms: tuple[ConfigSynonym, ...] = ()
    documentation: str | None = None


def describe_topic(
    topic_configs: Mapping[str, str],
    node: NodeConfig,
    keys: Iterable[str] | None = None,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[DescribedConfig]:
    """DescribeConfigs for a topic resource. `keys` None = all; unknown keys are left out (as Kafka)."""
    names = list(TOPIC_CONFIGS) if keys is None else [k for k in keys if k in TOPIC_CONFIGS]
    out = []
    for name in names:
        key = TOPIC_CONFIGS[name]
        default_value, default_source = broker_default(key, node)
        synonyms: list[ConfigSynonym] = []
        if name in topic_configs:
            value, source = topic_configs[name], ConfigSource.DYNAMIC_TOPIC_CONFIG
            synonyms.append(ConfigSynonym(name, value, ConfigSource.DYNAMIC_TOPIC_CONFIG))
        else:
            value, source = default_value, default_source
        # Kafka lists the broker-level synonyms under their broker names, highest precedence first.
        synonym_name = key.broker_key or name
        if default_source is ConfigSource.STATIC_BROKER_CONFIG:
            synonyms.append(ConfigSynonym(synonym_name, default_value, ConfigSource.STATIC_BROKER_CONFIG))
            synonyms.append(ConfigSynonym(synonym_name, builtin_default(key, node), ConfigSource.DEFAULT_CONFIG))
        else:
            synonyms.append(ConfigSynonym(synonym_name, default_value, ConfigSource.DEFAULT_CONFIG))
        out.append(
            DescribedConfig(
                name=name,
                value=value,
                source=source,
                type=key.type,
                is_default=source is ConfigSource.DEFAULT_CONFIG,
                synonyms=tuple(synonyms) if include_synonyms else (),
                documentation=f"{key.doc} Here: {key.effect}." if include_documentation else None,
            )
        )
    return out


def _broker_entries(node: NodeConfig) -> list[tuple[str, str | None, ConfigSource, ConfigType, str]]:
    """(name, value, source, type, doc) of every broker-level key this broker reports."""
    kafka = node.kafka
    entries: list[tuple[str, str | None, ConfigSource, ConfigType, str]] = []
    explicit_top = node.model_fields_set
    listener = node.listeners[0] if node.listeners else None

    def src(explicit: bool) -> ConfigSource:
        return ConfigSource.STATIC_BROKER_CONFIG if explicit else ConfigSource.DEFAULT_CONFIG

    entries.append(("node.id", str(node.node_id), ConfigSource.STATIC_BROKER_CONFIG, ConfigType.INT, "This node's id."))
    entries.append(
        ("broker.id", str(node.node_id), ConfigSource.STATIC_BROKER_CONFIG, ConfigType.INT, "Same as node.id.")
    )
    entries.append(("broker.rack", node.rack, src("rack" in explicit_top), ConfigType.STRING, "Rack of this broker."))
    if listener is not None:
        listeners = ",".join(f"{lst.name}://{lst.host}:{lst.port}" for lst in node.listeners)
        advertised = ",".join(
            f"{lst.name}://{lst.advertised_host or (lst.host if lst.host != '0.0.0.0' else '127.0.0.1')}:{lst.advertised_port or lst.port}"
            for lst in node.listeners
        )
        entries.append(
            ("listeners", listeners, src("listeners" in explicit_top), ConfigType.LIST, "Listeners the broker binds.")
        )
        entries.append(
            (
                "advertised.listeners",
                advertised,
                src("listeners" in explicit_top),
                ConfigType.LIST,
                "Listeners clients are told.",
            )
        )
    for field_name, info in type(kafka).model_fields.items():
        value = getattr(kafka, field_name)
        if isinstance(value, bool):
            ctype = ConfigType.BOOLEAN
        elif isinstance(value, int):
            ctype = ConfigType.LONG if field_name.endswith(("_ms", "_bytes")) else ConfigType.INT
        else:
            ctype = ConfigType.STRING
        entries.append(
            (
                kafka_name(field_name) or field_name.replace("_", "."),
                _render(value),
                src(field_name in kafka.model_fields_set),
                ctype,
                info.description or f"kafka.{field_name} in the node config file.",
            )
        )
    # Broker synonyms of topic keys that the node config has no field for: Kafka's defaults.
    known = {e[0] for e in entries}
    for key in TOPIC_CONFIGS.values():
        if key.broker_key and key.broker_key not in known:
            entries.append(
                (
                    key.broker_key,
                    key.default,
                    ConfigSource.DEFAULT_CONFIG,
                    key.type,
                    f"Default of topic config {key.name}.",
                )
            )
            known.add(key.broker_key)
    return entries


def describe_broker(
    node: NodeConfig,
    keys: Iterable[str] | None = None,
    include_synonyms: bool = False,
    include_documentation: bool = False,
) -> list[DescribedConfig]:
    """DescribeConfigs for this broker's resource. Broker configs come from the static file,
    so all are read-only (no dynamic broker configs)."""
    wanted = None if keys is None else set(keys)
    out = []
    for name, value, source, ctype, doc in _broker_entries(node):
        if wanted is not None and name not in wanted:
            continue
        out.append(
            DescribedConfig(
                name=name,
                value=value,
                source=source,
                type=ctype,
                read_only=True,
                is_default=source is ConfigSource.DEFAULT_CONFIG,
                synonyms=(ConfigSynonym(name, value, source),) if include_synonyms else (),
                documentation=doc if include_documentation else None,
            )
        )
    return out


def topic_config_table() -> str:
    """The Markdown table of topic configs for docs/configuration.md (generated, not hand-kept)."""
    lines = [
        "| Key | Type | Default (broker key) | Meaning | What this system does |",
        "|---|---|---|---|---|",
    ]
    for key in TOPIC_CONFIGS.values():
        default = f"`{key.default}`" if key.default != "" else "(empty)"
        broker = f" (`{key.broker_key}`)" if key.broker_key else ""
        lines.append(f"| `{key.name}` | {key.type.name} | {default}{broker} | {key.doc} | {key.effect} |")
    return "\n".join(lines) + "\n"
