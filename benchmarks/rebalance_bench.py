"""Balancer benchmark: how long moving partitions takes through the balancer's executor,
on a real local cluster (controller + 2 broker processes). Prints numbers; asserts nothing.

    python benchmarks/rebalance_bench.py                    # 100 partitions (~2-4 min on 2 cores)
    python benchmarks/rebalance_bench.py --partitions 20 --records 200
    python benchmarks/rebalance_bench.py --bootstrap 127.0.0.1:9092   # an already running cluster

What it measures, in one run:
1. baseline: one move of one idle partition (AlterPartitionReassignments until the new
   leader answers ListOffsets), the smallest unit everything else is made of;
2. planning: the pure planner on a synthetic 2000-partition, 10-broker model (ms);
3. drain: every partition of a topic with --partitions partitions (each holding --records
   1 KiB records) moved off broker 1 by `drain()` + `MoveExecutor`, at --concurrency 4 and
   16 (the issue's goal: a broker with 100 partitions drained in under 10 s). Before each
   drain the partitions are put back on broker 1 (not timed).

The machine running this is usually shared; the numbers are from whatever else it was doing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid

from kafka_bench import Cluster, create_topic

from automq.broker.balancer.executor import MoveExecutor
from automq.broker.balancer.kafka_admin import KafkaAdmin
from automq.broker.balancer.model import LoadModel, PartitionLoad
from automq.broker.balancer.planner import Goals, Move, drain, plan


def fill(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    if records <= 0:
        return
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    value = b"x" * 1024
    for i in range(records * partitions):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


async def put_all_on(admin: KafkaAdmin, topic: str, broker: int, concurrency: int) -> None:
    md = await admin.metadata([topic])
    moves = [Move(t, p, leader, broker, "setup") for (t, p), leader in sorted(md.leaders.items()) if leader != broker]
    results = await MoveExecutor(admin, max_concurrent=concurrency, move_timeout_s=300).execute(moves)
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"setup moves failed: {failed[:3]}")


async def model_of(admin: KafkaAdmin, topic: str) -> LoadModel:
    """Where the topic's partitions are, no rates: a drain is placement, not load."""
    md = await admin.metadata()
    parts = [PartitionLoad(t, p, leader) for (t, p), leader in md.leaders.items() if t == topic]
    return LoadModel.from_partitions(sorted(md.brokers), parts)


async def run(args: argparse.Namespace, bootstrap: str) -> None:
    topic = f"rebalance-bench-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, args.partitions)
    fill(bootstrap, topic, args.partitions, args.records)
    async with KafkaAdmin(bootstrap) as admin:
        brokers = sorted((await admin.metadata()).brokers)
        if len(brokers) < 2:
            raise SystemExit("needs at least 2 brokers")
        await put_all_on(admin, topic, brokers[0], 8)

        # 1. baseline: one move
        one = (await MoveExecutor(admin).execute([Move(topic, 0, brokers[0], brokers[1], "bench")]))[0]
        print(f"baseline  one move of one partition ({args.records} records): {one.seconds:.2f} s (ok={one.ok})")
        await put_all_on(admin, topic, brokers[0], 8)

        # 2. planning cost
        rnd = random.Random(1)
        synthetic = LoadModel.from_partitions(
            list(range(1, 11)),
            [
                PartitionLoad(f"t{i % 50}", i, rnd.choice([1, 2, 3]), rnd.random() * 1e6, rnd.random() * 2e6)
                for i in range(2000)
            ],
        )
        started = time.perf_counter()
        proposal = plan(synthetic, Goals(max_moves=20))
        print(
            f"planner   2000 partitions / 10 brokers, {len(proposal.moves)} moves: "
            f"{(time.perf_counter() - started) * 1000:.0f} ms"
        )

        # 3. drains
        for concurrency in args.concurrency:
            model = await model_of(admin, topic)
            proposal = drain(model, [brokers[0]])
            started = time.monotonic()
            results = await MoveExecutor(admin, max_concurrent=concurrency, move_timeout_s=300).execute(proposal.moves)
            took = time.monotonic() - started
            ok = sum(r.ok for r in results)
            slowest = max((r.seconds for r in results), default=0.0)
            print(
                f"drain     {len(proposal.moves)} partitions off broker {brokers[0]} at concurrency {concurrency}: "
                f"{took:.1f} s ({ok} ok, slowest move {slowest:.1f} s, goal < 10 s for 100)"
            )
            await put_all_on(admin, topic, brokers[0], 8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="use a running cluster instead of starting one")
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--object-store", default=None, help="s3://... for the local cluster (default: file://)")
    ap.add_argument("--seaweedfs", action="store_true", help="start a local SeaweedFS as the object store")
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--records", type=int, default=100, help="1 KiB records per partition")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    args = ap.parse_args()
    with Cluster(args) as cluster:
        asyncio.run(run(args, cluster.bootstrap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
