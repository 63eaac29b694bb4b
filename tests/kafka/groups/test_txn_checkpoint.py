"""The transaction coordinator's checkpoint (its `__transaction_state` partition rewritten with
the live state, then trimmed) racing with state changes: a state written while the checkpoint is
being written, and an id whose first record is still in flight when it starts, both survive a
move of the partition to another broker (replayed from the trimmed log). Real storage and
controller; the coordinator's own persistence path."""

from __future__ import annotations

import asyncio
import datetime
import time

from automq.broker.kafka.transactions.state import TxnMetadata, TxnState

FIND_COORDINATOR = 10
MINUTE = datetime.timedelta(minutes=1)


async def eventually(probe, timeout: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, f"not true within {timeout}s: {value!r}"
        await asyncio.sleep(0.05)


def metadata(tid: str, pid: int) -> TxnMetadata:
    return TxnMetadata(tid, pid, 0, 60_000, TxnState.EMPTY, last_update_ms=1, coordinator_partition=0)


async def test_checkpoint_keeps_states_written_while_it_runs(cluster) -> None:
    n1 = await cluster.start_node(1, transaction_state_log_num_partitions=1)
    await n1.broker.ensure_topic("t", partitions=1)
    coordinator = n1.broker.transactions

    async def loaded():
        await n1.call(FIND_COORDINATOR, 3, key="x", key_type=1)
        return coordinator.coordinator_error("x") is None

    await eventually(loaded)
    # 1200 ids: the checkpoint writes them in three chunks of 500
    ids = [f"id-{i:04d}" for i in range(1200)]
    assert all(await asyncio.gather(*(coordinator._persist(metadata(t, 1000 + i)) for i, t in enumerate(ids))))
    late = ids[-1]  # in the last chunk
    fresh = metadata("fresh", 5000)

    first = asyncio.ensure_future(coordinator._persist(fresh))  # in flight when the checkpoint starts
    await asyncio.sleep(0)
    checkpoint = asyncio.ensure_future(coordinator._checkpoint(0))
    await asyncio.sleep(0)  # the checkpoint took its list of ids and is writing its first chunk
    now = int(time.time() * 1000)  # (a start long ago would have the timeout abort it meanwhile)
    ongoing = coordinator.txns[late].copy(
        state=TxnState.ONGOING, partitions=frozenset({("t", 0)}), start_ms=now, last_update_ms=now
    )
    assert await coordinator._persist(ongoing)
    assert await first
    await checkpoint
    partition = coordinator._partitions[0]
    assert partition.log_start_offset > 0  # the log was trimmed below the checkpoint

    # the partition moves: its next leader replays the trimmed log
    await cluster.start_node(2, transaction_state_log_num_partitions=1)
    await cluster.stop_node(1)
    n2 = cluster.nodes[2]

    async def reloaded():
        return n2.broker.transactions.coordinator_error("x") is None

    await eventually(reloaded)
    replayed = n2.broker.transactions
    assert replayed.describe(late) is not None
    assert replayed.describe(late).state is TxnState.ONGOING  # not the Empty state the checkpoint began with
    assert replayed.describe(late).partitions == frozenset({("t", 0)})
    assert replayed.describe("fresh") is not None  # its record was below the trim point
    assert all(replayed.describe(t) is not None for t in ids)
