"""A group config set with IncrementalAlterConfigs is seen by every broker once the call is
answered: share-partition leaders read share.auto.offset.reset when a share-partition starts,
and clients (librdkafka's share tests among them) set it and subscribe right away. Real
controller and brokers in process; one broker's metadata watch is slowed down on purpose."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1.request import AlterableConfig, AlterConfigsResource

from automq.broker.kafka.groups.share_settings import share_settings

INCREMENTAL_ALTER_CONFIGS = 44
GROUP_RESOURCE = 32
SET = 0


def _slow_watch(node: Any, delay_s: float) -> None:
    """The node applies every new metadata image `delay_s` late (a busy broker)."""
    client = node.broker.cluster
    original = client.watch_metadata

    async def watch(since: int, timeout_ms: int, *args: Any, **kwargs: Any) -> Any:
        image = await original(since, timeout_ms, *args, **kwargs)
        await asyncio.sleep(delay_s)
        return image

    client.watch_metadata = watch


async def _set_reset(node: Any, group: str, value: str) -> list[ErrorCode]:
    answer = await node.call(
        INCREMENTAL_ALTER_CONFIGS,
        1,
        resources=(
            AlterConfigsResource(
                resource_type=GROUP_RESOURCE,
                resource_name=group,
                configs=(AlterableConfig(name="share.auto.offset.reset", config_operation=SET, value=value),),
            ),
        ),
        validate_only=False,
    )
    return [r.error_code for r in answer.responses]


async def test_group_config_is_on_every_broker_when_answered(cluster) -> None:
    one = await cluster.start_node(1)
    two = await cluster.start_node(2)
    _slow_watch(two, 1.0)
    # a first change ends node 2's long-poll in flight: from then on its watch is the slow one
    assert (await _set_reset(one, "warm-up", "earliest")) == [ErrorCode.none]
    await two.broker.partitions.wait_for_image(lambda img: bool(img.group_configs), 10)
    group = "propagated"
    assert share_settings(two.broker, group).auto_offset_reset == "latest"

    assert (await _set_reset(one, group, "earliest")) == [ErrorCode.none]

    assert share_settings(one.broker, group).auto_offset_reset == "earliest"
    assert share_settings(two.broker, group).auto_offset_reset == "earliest"
