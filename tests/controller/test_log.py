"""The metadata log on real object stores (file:// and SeaweedFS): conditional create per
entry, racing writers, snapshots, truncation, corruption."""

from __future__ import annotations

import asyncio

import pytest

from automq.broker.controller import commands as c
from automq.broker.controller import records as r
from automq.broker.controller.log import LogConflictError, LogCorruptError, MetadataLog
from automq.broker.controller.protocol import Endpoint
from automq.broker.controller.state import MetadataState
from automq.broker.objectstore import open_object_store


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request) -> str:
    return request.getfixturevalue("file_url" if request.param == "file" else "s3_url")


async def test_racing_writers_one_wins_each_entry(store_url: str) -> None:
    """Five controllers (each its own client/connection pool) race for every sequence
    number; exactly one wins each, and the log holds the winners' records in order. (Four
    rounds: SeaweedFS holds some losers of a conditional create for a second each.)"""
    stores = [open_object_store(store_url) for _ in range(5)]
    logs = [MetadataLog(s) for s in stores]
    winners = []
    try:
        for seq in range(4):
            results = await asyncio.gather(
                *(lg.append(seq, i, [r.LeaderHeartbeat(term=i, at_ms=seq)]) for i, lg in enumerate(logs)),
                return_exceptions=True,
            )
            ok = [i for i, res in enumerate(results) if res is None]
            lost = [res for res in results if res is not None]
            assert len(ok) == 1, results
            assert all(isinstance(res, LogConflictError) for res in lost), lost
            winners.append(ok[0])
        for seq, winner in enumerate(winners):
            entry = await logs[0].read_entry(seq)
            assert entry is not None and entry.writer == winner
            assert entry.records == [r.LeaderHeartbeat(term=winner, at_ms=seq)]
        assert await logs[0].read_entry(len(winners)) is None
    finally:
        for s in stores:
            await s.close()


async def test_replay_snapshot_and_truncate(store_url: str) -> None:
    store = open_object_store(store_url)
    try:
        lg = MetadataLog(store)
        live = MetadataState()
        seq = 0

        async def write(fn, *args):
            nonlocal seq
            tx = c.Tx(live, 1000 + seq)
            result = fn(tx, *args)
            await lg.append(seq, 0, tx.records)
            live.last_seq = seq
            seq += 1
            return result

        await write(c.init_cluster, "x")
        epoch = await write(c.register_broker, 1, [Endpoint("PLAINTEXT", "h", 1)], None)
        topic = await write(c.create_topic, "t", 3, {})
        for p in topic.partitions:
            await write(c.open_stream, p.stream_id, p.leader_epoch, 1, epoch)
        await lg.write_snapshot(live.last_seq, lg.encode_snapshot(live))
        first_snapshot = live.last_seq
        await write(c.create_topic, "u", 2, {})
        await lg.write_snapshot(live.last_seq, lg.encode_snapshot(live))
        await write(c.delete_topic, "t")
        await lg.write_snapshot(live.last_seq, lg.encode_snapshot(live))

        loaded = await MetadataLog(store).load()
        assert loaded.snapshot() == live.snapshot()

        removed = await lg.truncate()
        assert removed > 0
        assert await lg.read_entry(0) is None and await lg.read_entry(first_snapshot) is None
        assert len(await lg.snapshot_seqs()) == 2
        assert (await MetadataLog(store).load()).snapshot() == live.snapshot()

        # a corrupt newest snapshot is skipped in favour of the older one plus the log
        await store.put(lg.snapshot_key(live.last_seq), b"garbage")
        assert (await MetadataLog(store).load()).snapshot() == live.snapshot()
    finally:
        await store.close()


async def test_corrupt_entry_is_reported(file_url: str) -> None:
    store = open_object_store(file_url)
    try:
        lg = MetadataLog(store)
        await store.put(lg.entry_key(0), b'{"seq": 0, "writer": 1, "nonce": "n", "records": [{"type": "nope"}]}')
        with pytest.raises(LogCorruptError):
            await lg.read_entry(0)
        await store.put(lg.entry_key(1), b"\xff\x00 not json")
        with pytest.raises(LogCorruptError):
            await lg.read_entry(1)
        await store.put(lg.entry_key(2), MetadataLog.encode_entry(7, 1, "n", []))
        with pytest.raises(LogCorruptError):  # an entry must sit at its own sequence number
            await lg.read_entry(2)
    finally:
        await store.close()
