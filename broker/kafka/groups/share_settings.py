"""The settings of one share group that the partition side (ShareFetch, ShareAcknowledge)
needs: acquisition lock duration, delivery count limit, where a new share-partition starts,
isolation level, in-flight record cap.

Callable on any broker, without I/O: the broker's `kafka.group_share_*` defaults (Kafka's
`group.share.*` names) overridden by the group's dynamic configs (`share.*`, set with
IncrementalAlterConfigs on a GROUP resource and carried by the metadata image to every broker;
see group_configs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from automq.broker import group_configs

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    auto_offset_reset: str = "latest"  # "latest" | "earliest" | "by_duration:<ISO-8601 duration>"
    isolation_level: str = "read_uncommitted"  # | "read_committed"
    partition_max_record_locks: int = 2_000
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000


def share_settings(broker: Broker, group_id: str) -> ShareGroupSettings:
    values = group_configs.effective_group_config(group_configs.configs_of(broker.metadata, group_id), broker.config)
    return ShareGroupSettings(
        record_lock_duration_ms=int(values["share.record.lock.duration.ms"]),
        delivery_count_limit=int(values["share.delivery.count.limit"]),
        auto_offset_reset=values["share.auto.offset.reset"],
        isolation_level=values["share.isolation.level"],
        partition_max_record_locks=int(values["share.partition.max.record.locks"]),
        session_timeout_ms=int(values["share.session.timeout.ms"]),
        heartbeat_interval_ms=int(values["share.heartbeat.interval.ms"]),
    )
