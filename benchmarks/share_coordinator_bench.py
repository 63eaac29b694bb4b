"""Share-group coordinator state machine (KIP-932 ShareGroupHeartbeat) next to a KIP-848 consumer
group of the same size, measured in the same run (prints, never asserts).

For M members subscribed to one topic of P partitions:
1. join: every member joins with epoch 0 one after the other (each join recomputes the target
   assignment), total time;
2. steady heartbeat: members heartbeat at their epoch with nothing changed (what a coordinator
   does most), time per heartbeat; nothing must be written.

    python benchmarks/share_coordinator_bench.py [--members 200] [--partitions 100] [--heartbeats 20000]
"""

from __future__ import annotations

import argparse
import time
import uuid

from automq.broker.kafka.groups.consumer import HeartbeatRequest, TopicMeta
from automq.broker.kafka.groups.model import GroupConfig
from automq.broker.kafka.groups.share import ShareHeartbeatRequest
from automq.broker.kafka.groups.state import GroupManager


def manager(partitions: int) -> GroupManager:
    m = GroupManager(GroupConfig(), 1)
    topics = {"t": TopicMeta(uuid.UUID(int=1), partitions)}
    m.topic_view = lambda: topics
    return m


def share(members: int, partitions: int, heartbeats: int) -> tuple[float, float]:
    m = manager(partitions)
    ids = [str(uuid.uuid4()) for _ in range(members)]
    start = time.perf_counter()
    for i in ids:
        m.share_heartbeat(1, ShareHeartbeatRequest("g", i, 0, subscribed_topic_names=("t",)))
    join = time.perf_counter() - start
    data = m.groups["g"].share
    assert data is not None
    for i in ids:  # everyone at the last epoch
        m.share_heartbeat(2, ShareHeartbeatRequest("g", i, data.members[i].member_epoch))
    start = time.perf_counter()
    for k in range(heartbeats):
        i = ids[k % members]
        _, fx = m.share_heartbeat(3, ShareHeartbeatRequest("g", i, data.members[i].member_epoch))
        assert not fx.writes
    return join, (time.perf_counter() - start) / heartbeats


def consumer(members: int, partitions: int, heartbeats: int) -> tuple[float, float]:
    m = manager(partitions)
    ids = [str(uuid.uuid4()) for _ in range(members)]
    start = time.perf_counter()
    for i in ids:
        m.consumer_heartbeat(
            1,
            HeartbeatRequest(
                "g", i, 0, rebalance_timeout_ms=60_000, subscribed_topic_names=("t",), owned={}, version=1
            ),
        )
    join = time.perf_counter() - start
    data = m.groups["g"].consumer
    assert data is not None
    # reconcile everyone (revocations need a few rounds), owned partitions reported each time
    for _ in range(5):
        for i in ids:
            member = data.members[i]
            m.consumer_heartbeat(
                2,
                HeartbeatRequest("g", i, member.member_epoch, owned={t: set(ps) for t, ps in member.assigned.items()}),
            )
    start = time.perf_counter()
    for k in range(heartbeats):
        i = ids[k % members]
        m.consumer_heartbeat(3, HeartbeatRequest("g", i, data.members[i].member_epoch))
    return join, (time.perf_counter() - start) / heartbeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--heartbeats", type=int, default=20_000)
    args = parser.parse_args(argv)
    print(f"{args.members} members, 1 topic of {args.partitions} partitions, {args.heartbeats} steady heartbeats")
    c_join, c_hb = consumer(args.members, args.partitions, args.heartbeats)
    s_join, s_hb = share(args.members, args.partitions, args.heartbeats)
    print(f"  KIP-848 consumer group (baseline): joins {c_join * 1000:8.1f} ms   steady heartbeat {c_hb * 1e6:7.1f} us")
    print(f"  KIP-932 share group:               joins {s_join * 1000:8.1f} ms   steady heartbeat {s_hb * 1e6:7.1f} us")
    print(f"  share / consumer: joins {s_join / c_join:.2f}x, steady heartbeat {s_hb / c_hb:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
