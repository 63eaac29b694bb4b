"""Group coordinator and producer-state numbers (prints, never asserts).

1. State machine: heartbeats/s and the cost of one timer tick with G groups x M members.
2. OffsetCommit latency (p50/p99) through the real coordinator (handler -> state machine ->
   v2 batch -> storage engine volume WAL), next to a baseline measured in the same run: a raw
   append of a same-sized batch to a stream of the same engine.
3. ProducerStateManager check+record per second (the per-batch cost on the produce path).

    python benchmarks/group_coordinator_bench.py [--groups 500] [--members 10] [--commits 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from automq.broker.kafka.groups.log import OffsetKey, OffsetValue, encode_batch
from automq.broker.kafka.groups.state import GroupConfig, GroupManager
from automq.broker.kafka.producers import ProducerStateManager


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def bench_state_machine(groups: int, members: int) -> None:
    m = GroupManager(GroupConfig(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=0), num_partitions=50)
    now = 0
    ids: list[tuple[str, str, int]] = []
    for g in range(groups):
        gid = f"group-{g}"
        joined = []
        for i in range(members):
            fx = m.join(
                now,
                group_id=gid,
                member_id="",
                group_instance_id=None,
                client_id=f"c{i}",
                client_host="/h",
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                protocol_type="consumer",
                protocols=[("range", b"meta")],
                require_known_member_id=False,
                token=(g, i),
            )
            joined.extend(fx.replies)
        m.tick(now)
        group = m.groups[gid]
        for member_id in group.members:
            ids.append((gid, member_id, group.generation_id))
    started = time.perf_counter()
    rounds = 3
    for _ in range(rounds):
        for gid, member_id, gen in ids:
            m.heartbeat(now, gid, member_id, None, gen)
    elapsed = time.perf_counter() - started
    print(f"state machine: {groups} groups x {members} members: {rounds * len(ids) / elapsed:,.0f} heartbeats/s")
    started = time.perf_counter()
    for _ in range(10):
        m.next_deadline()
        m.tick(now + 1)
    per_tick = (time.perf_counter() - started) / 10
    print(f"state machine: one timer wake (next_deadline + tick) over {len(ids)} members: {per_tick * 1000:.2f} ms")


def bench_producer_state(batches: int) -> None:
    psm = ProducerStateManager()
    started = time.perf_counter()
    for i in range(batches):
        pid = i % 100
        seq = (i // 100) * 10
        psm.check(pid, 0, seq, 10)
        psm.record(pid, 0, seq, 10, i * 10, 0)
    elapsed = time.perf_counter() - started
    print(f"producer state: {batches / elapsed:,.0f} check+record per second (100 producers)")


async def bench_commits(commits: int) -> None:
    from automq.broker.config import NodeConfig
    from automq.broker.controller.client import ControllerClient
    from automq.broker.controller.process import ControllerService
    from automq.broker.kafka import codec, handlers
    from automq.broker.kafka.broker import Broker, advertised_endpoints
    from automq.broker.kafka.context import RequestContext
    from automq.broker.objectstore import open_object_store
    from automq.broker.storage.engine import StorageEngine

    tmp = Path(tempfile.mkdtemp(prefix="group-bench-"))
    objects = f"file://{tmp}/objects"
    ctl = ControllerService(
        NodeConfig(node_id=100, object_store_url=objects, http_host="127.0.0.1", http_port=0, data_dir=str(tmp / "c"))
    )
    await ctl.start()
    await ctl.controller.wait_leader(10)
    config = NodeConfig(
        node_id=1,
        data_dir=str(tmp / "b"),
        object_store_url=objects,
        controller_urls=[ctl.url],
        http_port=0,
        wal={"capacity": 64 << 20},
        kafka={"offsets_topic_num_partitions": 1},
    )
    client = ControllerClient([ctl.url])
    store = open_object_store(objects)
    epoch = await client.register_broker(1, advertised_endpoints(config), None)
    engine = StorageEngine(config, store, client, client, 1, epoch)
    await engine.start()
    broker = Broker(config, node_epoch=epoch, cluster=client, storage=engine)
    await broker.start()
    try:
        await broker.ensure_topic("t", partitions=1)

        async def call(api_key: int, version: int, **fields):
            request = codec.build(codec.request_class(api_key, version), **fields)
            ctx = RequestContext(
                api_key, version, 1, "bench", "127.0.0.1:1", codec.response_class(api_key, version), broker
            )
            return await handlers.lookup(api_key).handler(request, ctx)

        while (await call(10, 3, key="bench", key_type=0)).error_code != 0 or broker.groups.coordinator_error(
            "bench"
        ) is not None:
            await asyncio.sleep(0.05)
        req = codec.request_class(8, 8)
        part_cls, topic_cls = (
            codec.nested(req, "OffsetCommitRequestPartition"),
            codec.nested(req, "OffsetCommitRequestTopic"),
        )
        latencies = []
        for i in range(commits):
            topic = codec.build(
                topic_cls,
                name="t",
                partitions=(
                    codec.build(
                        part_cls,
                        partition_index=0,
                        committed_offset=i,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    ),
                ),
            )
            started = time.perf_counter()
            r = await call(
                8,
                8,
                group_id="bench",
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                topics=(topic,),
            )
            latencies.append(time.perf_counter() - started)
            assert r.topics[0].partitions[0].error_code == 0
        stream = await engine.open_stream(await engine.create_stream(), 0)
        record = [(OffsetKey("bench", "t", 0).encode(), OffsetValue(1, -1, "", 0).encode())]
        raw = []
        for _ in range(commits):
            batch = encode_batch(record, 0)
            started = time.perf_counter()
            await stream.append(batch, 1)
            raw.append(time.perf_counter() - started)
        print(
            f"OffsetCommit (1 partition, sequential): p50 {pct(latencies, 0.5) * 1e3:.2f} ms, p99 {pct(latencies, 0.99) * 1e3:.2f} ms, "
            f"{commits / sum(latencies):,.0f}/s"
        )
        print(
            f"baseline raw stream append of the same batch: p50 {pct(raw, 0.5) * 1e3:.2f} ms, p99 {pct(raw, 0.99) * 1e3:.2f} ms, "
            f"{commits / sum(raw):,.0f}/s  (mean overhead {(statistics.mean(latencies) - statistics.mean(raw)) * 1e3:.3f} ms)"
        )
    finally:
        await broker.close()
        await engine.close()
        await client.close()
        await store.close()
        await ctl.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=200_000)
    args = parser.parse_args(argv)
    bench_state_machine(args.groups, args.members)
    bench_producer_state(args.batches)
    asyncio.run(bench_commits(args.commits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
