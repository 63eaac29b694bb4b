"""operator.moves against a real controller (HTTP server, file:// object store) in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from automq.broker.balancer.planner import Move
from automq.broker.config import NodeConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import Endpoint, MetadataImage, PartitionInfo, TopicInfo
from automq.operator.controller_api import connect
from automq.operator.moves import execute_moves


@pytest.fixture
async def controller(file_url: str) -> AsyncIterator[ControllerService]:
    config = NodeConfig(
        node_id=1000,
        object_store_url=file_url,
        http_host="127.0.0.1",
        http_port=0,
        session_timeout_ms=60_000,
        controller={"lease_timeout_ms": 1_000, "renew_interval_ms": 200, "poll_interval_ms": 50},
    )
    service = ControllerService(config)
    await service.start()
    await service.controller.wait_leader(10)
    yield service
    await service.stop()


async def leaders(client: ControllerClient, topic: str) -> dict[int, int]:
    image = await client.watch_metadata(-1, 0)
    return {p.partition: p.leader for t in image.topics if t.name == topic for p in t.partitions}


async def test_moves_run_bounded_and_report_each_failure_with_why(controller: ControllerService) -> None:
    client = ControllerClient([controller.url], retry_deadline_s=5)
    api = connect([controller.url])
    try:
        for node in (1, 2, 3):
            await client.register_broker(node, [Endpoint("PLAINTEXT", f"b{node}", 9092)], None)
        await client.create_topic("orders", 6, {})
        before = await leaders(client, "orders")
        on_1 = [p for p, leader in before.items() if leader == 1]
        elsewhere = next(p for p, leader in before.items() if leader != 1)
        assert on_1, before
        checked: list[Move] = []

        async def serves(move: Move) -> bool:
            checked.append(move)
            return True

        good = [Move("orders", p, 1, 3 if before[p] != 3 else 2, "network") for p in on_1]
        stale = 1 if before[elsewhere] != 1 else 2
        bad = [
            Move("orders", elsewhere, before[elsewhere], 9, "network"),  # no such broker
            Move("orders", elsewhere, stale, 3, "network"),  # planned from an older view
            Move("ghost", 0, 1, 2, "network"),  # no such topic
        ]
        outcomes = await execute_moves(api, good + bad, max_concurrent=2, timeout_s=10, poll_s=0.02, serves=serves)
        assert [o.ok for o in outcomes] == [True] * len(good) + [False, False, False]
        assert "node 9 is not an active" in (outcomes[len(good)].error or "")
        assert f"is led by broker {before[elsewhere]}, not {stale}" in (outcomes[len(good) + 1].error or "")
        assert "no longer exists" in (outcomes[len(good) + 2].error or "")
        after = await leaders(client, "orders")
        for move in good:
            assert after[move.partition] == move.target
        assert checked == good  # done only once the target said it serves

        # A target that never serves: reported as not finished, not as done.
        p = good[0].partition
        stuck = await execute_moves(
            api,
            [Move("orders", p, after[p], 1, "network")],
            max_concurrent=1,
            timeout_s=0.5,
            poll_s=0.02,
            serves=lambda move: _never(),
        )
        assert not stuck[0].ok and "not finished within" in (stuck[0].error or "")
        # Asking again (a retry by the next evaluation) finds the move already made and finishes it.
        again = await execute_moves(
            api, [Move("orders", p, after[p], 1, "network")], max_concurrent=1, timeout_s=5, poll_s=0.02
        )
        assert again[0].ok
    finally:
        await api.close()
        await client.close()


async def _never() -> bool:
    return False


class SlowController:
    """A controller whose moves take a while: counts how many are in flight at once."""

    def __init__(self, partitions: int) -> None:
        self.leaders = dict.fromkeys(range(partitions), 1)
        self.in_flight = 0
        self.most = 0

    async def metadata(self) -> MetadataImage:
        parts = tuple(PartitionInfo("t", p, p, leader, 1) for p, leader in self.leaders.items())
        return MetadataImage(1, "c", 1000, (), (TopicInfo("t", "id", parts),))

    async def reassign_partition(self, topic: str, partition: int, target: int) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.05)
        self.leaders[partition] = target
        self.in_flight -= 1


async def test_no_more_than_max_concurrent_moves_are_in_flight() -> None:
    api = SlowController(12)
    moves = [Move("t", p, 1, 2, "evacuate") for p in range(12)]
    # SlowController has just the two calls execute_moves makes.
    outcomes = await execute_moves(api, moves, max_concurrent=3, timeout_s=10, poll_s=0.01)  # type: ignore[arg-type]
    assert all(o.ok for o in outcomes) and api.most == 3
