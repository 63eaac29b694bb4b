"""Per-group dynamic configs (Kafka's group configs, ConfigResource type GROUP): the keys this
broker honours, their validation, their broker-wide defaults, and how they are described.

They are set with IncrementalAlterConfigs (`kafka-configs --entity-type groups`, the admin
clients' `incremental_alter_configs` on a GROUP resource), kept in the controller's metadata
(every broker sees them, as the share-partition leaders need them) and read by
`effective_group_config`. Only keys that take effect are accepted: the KIP-848 consumer group
session timeout and heartbeat interval, and the share-group keys of KIP-932 and KIP-1240.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from automq.broker.topic_configs import (
    AlterConfigOp,
    ConfigSource,
    ConfigSynonym,
    ConfigType,
    DescribedConfig,
    TopicConfigError,
)

if TYPE_CHECKING:
    from automq.broker.config import NodeConfig
    from automq.broker.controller.protocol import MetadataImage

# ISO-8601 durations as Java's Duration.parse takes them (PnDTnHnMn.nS), days to seconds
_DURATION = re.compile(
    r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d{1,9})?)S)?)?$", re.IGNORECASE
)


def parse_by_duration(value: str) -> int:
    """Milliseconds of `by_duration:<ISO-8601 duration>`; ValueError in Kafka's words."""
    text = value[len("by_duration:") :].strip()
    match = _DURATION.match(text)
    if not match or text.upper() in ("P", "PT") or text.upper().endswith("T"):
        raise ValueError(f"Invalid duration: {text}")
    days, hours, minutes = (int(match.group(k) or 0) for k in "dhm")
    seconds = float(match.group("s") or 0)
    return int(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)


def _reset(value: str) -> str:
    v = value.strip()
    if v.lower() in ("latest", "earliest"):
        return v.lower()
    if v.lower().startswith("by_duration:"):
        parse_by_duration(v)
        return "by_duration:" + v[len("by_duration:") :].strip()
    raise ValueError("String must be one of: latest, earliest, by_duration:PnDTnHnMn.nS")


def _choice(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        v = value.strip().lower()
        if v not in choices:
            raise ValueError(f"String must be one of: {', '.join(choices)}")
        return v

    return check


def _int(lo: int, hi: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            n = int(value.strip())
        except ValueError:
            raise ValueError("Not a number of type INT") from None
        if n < lo:
            raise ValueError(f"Value must be at least {lo}")
        if n > hi:
            raise ValueError(f"Value must be no more than {hi}")
        return str(n)

    return check


@dataclass(frozen=True, slots=True)
class GroupConfigKey:
    name: str
    type: ConfigType
    check: Callable[[str], str]
    broker_key: str | None  # the kafka.* field whose value is the default, if any
    default: str  # when broker_key is None
    doc: str


GROUP_CONFIGS: dict[str, GroupConfigKey] = {
    k.name: k
    for k in (
        GroupConfigKey(
            "consumer.session.timeout.ms",
            ConfigType.INT,
            _int(1_000, 3_600_000),
            "group_consumer_session_timeout_ms",
            "",
            "A KIP-848 consumer group member silent this long is removed.",
        ),
        GroupConfigKey(
            "consumer.heartbeat.interval.ms",
            ConfigType.INT,
            _int(100, 3_600_000),
            "group_consumer_heartbeat_interval_ms",
            "",
            "The heartbeat interval given to a KIP-848 consumer group's members.",
        ),
        GroupConfigKey(
            "share.auto.offset.reset",
            ConfigType.STRING,
            _reset,
            None,
            "latest",
            "Where a share group starts on a partition it has no state for: latest, earliest, or "
            "by_duration:<ISO-8601 duration> before now.",
        ),
        GroupConfigKey(
            "share.isolation.level",
            ConfigType.STRING,
            _choice("read_uncommitted", "read_committed"),
            None,
            "read_uncommitted",
            "Whether a share group delivers records of open or aborted transactions.",
        ),
        GroupConfigKey(
            "share.record.lock.duration.ms",
            ConfigType.INT,
            _int(1_000, 3_600_000),
            "group_share_record_lock_duration_ms",
            "",
            "How long a share consumer holds an acquired record before it is delivered again.",
        ),
        GroupConfigKey(
            "share.delivery.count.limit",
            ConfigType.INT,
            _int(2, 10),
            "group_share_delivery_count_limit",
            "",
            "Deliveries of a record before it is archived (KIP-1240).",
        ),
        GroupConfigKey(
            "share.partition.max.record.locks",
            ConfigType.INT,
            _int(100, 10_000),
            "group_share_partition_max_record_locks",
            "",
            "In-flight records of a share-partition at most (KIP-1240).",
        ),
        GroupConfigKey(
            "share.session.timeout.ms",
            ConfigType.INT,
            _int(1_000, 3_600_000),
            "group_share_session_timeout_ms",
            "",
            "A share group member silent this long is removed.",
        ),
        GroupConfigKey(
            "share.heartbeat.interval.ms",
            ConfigType.INT,
            _int(100, 3_600_000),
            "group_share_heartbeat_interval_ms",
            "",
            "The heartbeat interval given to a share group's members.",
        ),
    )
}


def default_value(key: GroupConfigKey, node: NodeConfig | None) -> str:
    if key.broker_key is None or node is None:
        return key.default
    return str(getattr(node.kafka, key.broker_key))


def _validate(name: str, value: str | None) -> str:
    key = GROUP_CONFIGS.get(name)
    if key is None:
        raise TopicConfigError(f"Unknown group config name: {name}")
    if value is None:
        raise TopicConfigError(f"Null value not supported for group configs: {name}")
    try:
        return key.check(value)
    except ValueError as exc:
        raise TopicConfigError(f"Invalid value {value} for configuration {name}: {exc}") from None


def _check_consistency(configs: Mapping[str, str], node: NodeConfig | None) -> None:
    # Kafka: the heartbeat interval must be below the session timeout (checked where both are
    # known: the controller has no broker defaults and checks only what the group sets)
    def value(name: str) -> int | None:
        text = configs.get(name) or default_value(GROUP_CONFIGS[name], node)
        return int(text) if text else None

    if node is not None:
        # Kafka: a group's share.* value must lie within the broker's group.share.min/max.* bounds
        for name in (
            "share.record.lock.duration.ms",
            "share.session.timeout.ms",
            "share.heartbeat.interval.ms",
            "share.delivery.count.limit",  # KIP-1240
            "share.partition.max.record.locks",
        ):
            text = configs.get(name)
            if not text:
                continue
            what = name.removeprefix("share.")
            lo_key, hi_key = f"group.share.min.{what}", f"group.share.max.{what}"
            lo = getattr(node.kafka, lo_key.replace(".", "_"))
            hi = getattr(node.kafka, hi_key.replace(".", "_"))
            if int(text) < lo:
                raise TopicConfigError(f"{name} must be greater than or equal to {lo_key} ({lo})")
            if int(text) > hi:
                raise TopicConfigError(f"{name} must be less than or equal to {hi_key} ({hi})")

    for kind in ("consumer", "share"):
        hb, session = value(f"{kind}.heartbeat.interval.ms"), value(f"{kind}.session.timeout.ms")
        if hb is not None and session is not None and hb >= session:
            raise TopicConfigError(
                f"{kind}.heartbeat.interval.ms ({hb}) must be less than {kind}.session.timeout.ms ({session})"
            )


def apply_incremental(
    current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]], node: NodeConfig | None = None
) -> dict[str, str | None]:
    """IncrementalAlterConfigs on a group: the changes for the controller ({key: value, or None
    to remove}). Raises TopicConfigError (INVALID_CONFIG / INVALID_REQUEST) naming the key."""
    seen: set[str] = set()
    result = dict(current)
    for name, op, value in ops:
        if name in seen:
            raise TopicConfigError(f"Error due to duplicate config keys: {name}", ErrorCode.invalid_request)
        seen.add(name)
        try:
            operation = AlterConfigOp(op)
        except ValueError:
            raise TopicConfigError(f"Unknown config operation {op} for {name}", ErrorCode.invalid_request) from None
        if operation is AlterConfigOp.SET:
            result[name] = _validate(name, value)
        elif operation is AlterConfigOp.DELETE:
            if name not in GROUP_CONFIGS:
                _validate(name, value)
            result.pop(name, None)
        else:
            raise TopicConfigError(f"Config value append/subtract is not allowed for config key: {name}")
    _check_consistency(result, node)
    changes: dict[str, str | None] = {k: v for k, v in result.items() if current.get(k) != v}
    changes.update({k: None for k in current if k not in result})
    return changes


def replace_all(
    current: Mapping[str, str], configs: Iterable[tuple[str, str | None]], node: NodeConfig | None = None
) -> dict[str, str | None]:
    """AlterConfigs (non-incremental) on a group: the given set replaces the group's configs."""
    new: dict[str, str] = {}
    for name, value in configs:
        if name in new:
            raise TopicConfigError(f"Duplicate group config name: {name}", ErrorCode.invalid_request)
        new[name] = _validate(name, value)
    _check_consistency(new, node)
    changes: dict[str, str | None] = {k: v for k, v in new.items() if current.get(k) != v}
    changes.update({k: None for k in current if k not in new})
    return changes


_index: tuple[object, dict[str, dict[str, str]]] = (None, {})


def configs_of(image: MetadataImage | None, group_id: str) -> dict[str, str]:
    """The configs set on `group_id` in a metadata image ({} when none)."""
    global _index
    if image is None:
        return {}
    if _index[0] is not image:  # images are immutable: index the latest one once
        _index = (image, {e.group_id: e.configs for e in image.group_configs})
    return dict(_index[1].get(group_id, {}))


def effective_group_config(group_configs: Mapping[str, str], node: NodeConfig | None) -> dict[str, str]:
    """Every group config key with the value that applies to the group."""
    return {name: group_configs.get(name, default_value(key, node)) for name, key in GROUP_CONFIGS.items()}


def describe_group(
    group_configs: Mapping[str, str],
    node: NodeConfig,
    keys: list[str] | None,
    include_synonyms: bool,
    include_docs: bool,
) -> list[DescribedConfig]:
    out = []
    for name, key in GROUP_CONFIGS.items():
        if keys is not None and name not in keys:
            continue
        default = default_value(key, node)
        set_here = name in group_configs
        synonyms: tuple[ConfigSynonym, ...] = ()
        if include_synonyms:
            if set_here:
                synonyms = (ConfigSynonym(name, group_configs[name], ConfigSource.GROUP_CONFIG),)
            if key.broker_key is not None:
                # the broker-wide default, under Kafka's broker key (group.share.*)
                synonyms += (ConfigSynonym("group." + name, default, ConfigSource.DEFAULT_CONFIG),)
        out.append(
            DescribedConfig(
                name=name,
                value=group_configs.get(name, default),
                source=ConfigSource.GROUP_CONFIG if set_here else ConfigSource.DEFAULT_CONFIG,
                type=key.type,
                is_default=not set_here,
                synonyms=synonyms,
                documentation=key.doc if include_docs else None,
            )
        )
    return out
