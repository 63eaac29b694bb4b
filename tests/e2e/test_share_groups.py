"""KIP-932 share groups with librdkafka's ShareConsumer (confluent-kafka) against a 3-broker
local cluster (real processes, file:// object store):

- several share consumers on one topic: every record is acknowledged exactly once across
  the group, including the records a consumer held when it was killed -9 (redelivered once
  their locks expire);
- a poison record released on every delivery is archived at the delivery-count limit;
- a broker killed -9 while consumers hold and acknowledge records: after it comes back,
  nothing acknowledged is delivered again, and everything else is;
- hostile share requests over a raw socket get Kafka's error codes.
"""

from __future__ import annotations

import datetime
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec

pytestmark = pytest.mark.slow

LOCK_MS = 4000
DELIVERY_LIMIT = 3


@pytest.fixture(scope="module")
def share_cluster(tmp_path_factory, e2e):
    cluster = e2e.LocalCluster(
        tmp_path_factory.mktemp("share"),
        3,
        e2e.free_port_block(3),
        sets=[
            "group.initial.rebalance.delay.ms=0",
            f"group.share.record.lock.duration.ms={LOCK_MS}",
            f"group.share.delivery.count.limit={DELIVERY_LIMIT}",
            # a killed member keeps its assigned partitions until its session times out
            "group.share.session.timeout.ms=6000",
            "group.share.heartbeat.interval.ms=1000",
            # lets a group hold its locks for 10 minutes (test_connection_close_releases_locks)
            "group.share.max.record.lock.duration.ms=600000",
        ],
    ).start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            cluster.kill()


def _share_consumer(bootstrap: str, group: str, **config):
    from confluent_kafka import ShareConsumer

    return ShareConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit", **config}
    )


def _state_objects(cluster, group: str) -> int:
    """Share-partitions the group has durable state for (a leader writes it on the group's
    first ShareFetch of the partition): the consumers are fetching once this reaches the
    partition count, so records produced from then on are theirs (share.auto.offset.reset=latest)."""
    from automq.broker.kafka.share.state_store import group_prefix

    root = Path(cluster.data_dir) / "objects" / group_prefix(group)
    return len(list(root.glob("*%obj"))) if root.exists() else 0


def _wait_fetching(cluster, group: str, partitions: int, poll, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _state_objects(cluster, group) < partitions:
        assert time.monotonic() < deadline, f"share group {group} never fetched all {partitions} partitions"
        poll()


class Survivor(threading.Thread):
    """A share consumer that accepts everything it gets and counts successful acknowledgements."""

    def __init__(self, bootstrap: str, group: str, topic: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.topic, self.stop_event = bootstrap, group, topic, stop
        self.accepted: Counter[bytes] = Counter()
        self.redelivered = 0
        self.errors: list[str] = []

    def run(self) -> None:
        consumer = _share_consumer(self.bootstrap, self.group)
        consumer.subscribe([self.topic])
        try:
            while not self.stop_event.is_set():
                batch = [m for m in consumer.poll(0.5) if m.error() is None]
                if not batch:
                    continue
                for m in batch:
                    consumer.acknowledge(m)
                    if (m.delivery_count() or 1) > 1:
                        self.redelivered += 1
                result = consumer.commit_sync(30)
                failed = {(tp.partition) for tp, err in result.items() if err is not None}
                self.errors += [f"{tp}: {err}" for tp, err in result.items() if err is not None]
                for m in batch:
                    if m.partition() not in failed:
                        self.accepted[m.value()] += 1
        finally:
            consumer.close()


_VICTIM = r"""
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
while True:
    batch = [m for m in c.poll(0.5) if m.error() is None]
    if batch:
        print("GOT", len(batch), flush=True)
        time.sleep(3600)  # holds the locks until killed
    else:
        print("POLL", flush=True)
"""


def test_share_consumers_acknowledge_every_record_once_and_a_killed_consumers_records_come_back(share_cluster, e2e):
    cluster = share_cluster
    topic, group = e2e.topic_name("sq"), f"sg-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=3)
    # locks far longer than the test: the killed consumer's records can only come back
    # through the close of its connections
    _set_group_config(cluster.bootstrap, group, "share.record.lock.duration.ms", "600000")
    victim = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, cluster.bootstrap, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert victim.stdout is not None
        _wait_fetching(cluster, group, 3, lambda: victim.stdout.readline())  # type: ignore[union-attr]
        values = [f"r{i}".encode() for i in range(600)]
        e2e.produce(cluster.bootstrap, topic, values)
        line = ""
        while not line.startswith("GOT"):
            line = victim.stdout.readline()
            assert line, "the victim consumer exited"
        held = int(line.split()[1])
        assert held > 0
        victim.send_signal(signal.SIGKILL)  # no acknowledgement, no session close, no leave
        victim.wait(10)
        stop = threading.Event()
        survivors = [Survivor(cluster.bootstrap, group, topic, stop) for _ in range(2)]
        for s in survivors:
            s.start()
        deadline = time.monotonic() + 120
        while sum(sum(s.accepted.values()) for s in survivors) < len(values) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # anything delivered twice would show up now
        stop.set()
        for s in survivors:
            s.join(60)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    total: Counter[bytes] = Counter()
    for s in survivors:
        total.update(s.accepted)
    missing = [v for v in values if total[v] == 0]
    twice = [v for v, n in total.items() if n > 1]
    assert not missing, f"{len(missing)} records never acknowledged, e.g. {missing[:5]}"
    assert not twice, f"records acknowledged twice: {twice[:5]}"
    # the victim's records were delivered again (delivery count 2): its connection closed with
    # it, which ended its share sessions and released what it held before the locks expired
    assert sum(s.redelivered for s in survivors) >= held
    assert _broker_metric(cluster, "kafka_share_records_released_on_close_total") >= held


def _set_group_config(bootstrap: str, group: str, name: str, value: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)
    deadline = time.monotonic() + 30
    while True:  # every broker applies it once the controller's metadata reaches it
        described = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])
        configs = next(iter(described.values())).result(30)
        if configs[name].value == value:
            break
        assert time.monotonic() < deadline, f"{name}={value} not visible"
        time.sleep(0.1)


def _broker_metric(cluster, name: str) -> float:
    """The sum of a metric over the cluster's brokers."""
    import urllib.request

    total = 0.0
    for b in (1, 2, 3):
        port = cluster.http_port(f"broker-{b}")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        total += sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))
    return total


def test_a_stuck_consumers_records_come_back_when_their_locks_expire(share_cluster, e2e):
    """A member that stays connected but never acknowledges (hung): its locks expire after
    share.record.lock.duration.ms and another member gets the records."""
    cluster = share_cluster
    topic, group = e2e.topic_name("stuck"), f"sg-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    expired_before = _broker_metric(cluster, "kafka_share_records_lock_expired_total")
    stuck = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, cluster.bootstrap, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert stuck.stdout is not None
        _wait_fetching(cluster, group, 1, lambda: stuck.stdout.readline())  # type: ignore[union-attr]
        values = [f"s{i}".encode() for i in range(20)]
        e2e.produce(cluster.bootstrap, topic, values)
        line = ""
        while not line.startswith("GOT"):
            line = stuck.stdout.readline()
            assert line, "the stuck consumer exited"
        held = int(line.split()[1])
        stop = threading.Event()
        other = Survivor(cluster.bootstrap, group, topic, stop)
        other.start()
        deadline = time.monotonic() + 120
        while sum(other.accepted.values()) < len(values) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        other.join(60)
        assert stuck.poll() is None, "the stuck consumer must still be connected"
    finally:
        stuck.kill()
        stuck.wait(10)
    assert set(other.accepted) == set(values) and all(n == 1 for n in other.accepted.values())
    assert other.redelivered >= held
    assert _broker_metric(cluster, "kafka_share_records_lock_expired_total") - expired_before >= held


def test_a_poison_record_is_archived_at_the_delivery_limit(share_cluster, e2e):
    from confluent_kafka import AcknowledgeType

    cluster = share_cluster
    topic, group = e2e.topic_name("poison"), f"sg-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    consumer = _share_consumer(cluster.bootstrap, group)
    consumer.subscribe([topic])
    seen: Counter[bytes] = Counter()
    try:
        _wait_fetching(cluster, group, 1, lambda: consumer.poll(0.5))
        e2e.produce(cluster.bootstrap, topic, [b"a", b"poison", b"b"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (seen[b"a"] and seen[b"b"] and seen[b"poison"] >= DELIVERY_LIMIT):
            for m in consumer.poll(0.5):
                if m.error() is not None:
                    continue
                seen[m.value()] += 1
                bad = m.value() == b"poison"
                consumer.acknowledge(m, AcknowledgeType.RELEASE if bad else AcknowledgeType.ACCEPT)
            consumer.commit_sync(30)
        # archived after the limit: a few more polls bring nothing back
        for _ in range(6):
            for m in consumer.poll(0.5):
                if m.error() is None:
                    seen[m.value()] += 1
                    consumer.acknowledge(m, AcknowledgeType.RELEASE)
            consumer.commit_sync(30)
    finally:
        consumer.close()
    assert seen == Counter({b"a": 1, b"b": 1, b"poison": DELIVERY_LIMIT})


# ---------------------------------------------------------------- raw frames


_CONNECTIONS: dict[int, socket.socket] = {}


def _call(port: int, request, correlation_id: int = 1):
    """One request over a connection kept open per port: a share session ends with the
    connection it was used on, as in Kafka."""
    s = _CONNECTIONS.get(port)
    if s is None:
        s = _CONNECTIONS[port] = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.settimeout(10)
    body = codec.encode_request(correlation_id, request)
    s.sendall(struct.pack(">i", len(body)) + body)
    head = s.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack(">i", head)
    data = b""
    while len(data) < size:
        chunk = s.recv(size - len(data))
        assert chunk, "broker closed the connection"
        data += chunk
    correlation, response = codec.decode_response(data, type(request))
    assert correlation == correlation_id
    return response


def test_hostile_share_requests_get_kafkas_error_codes(share_cluster, e2e):
    from kio.schema.share_acknowledge.v1 import request as ack_v1
    from kio.schema.share_fetch.v1 import request as fetch_v1

    cluster = share_cluster
    topic = e2e.topic_name("hostile")
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    leaders = e2e.wait_for_leaders(cluster.bootstrap, topic, 1)
    from kio.schema.metadata.v12 import request as md_v12

    port = cluster.port + leaders[0] - 1
    md = _call(
        port,
        md_v12.MetadataRequest(
            topics=(md_v12.MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
    )
    topic_id = md.topics[0].topic_id

    def fetch(epoch: int, acks=(), member="m-1", group="hg", tid=topic_id):
        return _call(
            port,
            fetch_v1.ShareFetchRequest(
                group_id=group,
                member_id=member,
                share_session_epoch=epoch,
                max_wait=datetime.timedelta(milliseconds=0),
                min_bytes=1,
                max_bytes=1 << 20,
                max_records=100,
                batch_size=100,
                topics=(
                    fetch_v1.FetchTopic(
                        topic_id=tid,
                        partitions=(
                            fetch_v1.FetchPartition(
                                partition_index=0,
                                acknowledgement_batches=tuple(
                                    fetch_v1.AcknowledgementBatch(
                                        first_offset=f, last_offset=la, acknowledge_types=(1,)
                                    )
                                    for f, la in acks
                                ),
                            ),
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            ),
        )

    assert fetch(0, acks=[(0, 0)]).error_code == ErrorCode.invalid_request  # acks on the opening fetch
    assert fetch(3).error_code == ErrorCode.share_session_not_found
    assert fetch(0).error_code == ErrorCode.none
    assert fetch(7).error_code == ErrorCode.invalid_share_session_epoch
    r = fetch(1, acks=[(0, (1 << 62))])  # an oversized acknowledgement batch
    assert r.error_code == ErrorCode.none
    assert r.responses[0].partitions[0].acknowledge_error_code == ErrorCode.invalid_record_state
    r = fetch(0, member="m-2", tid=uuid.uuid4())
    assert r.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id
    r = _call(
        port,
        ack_v1.ShareAcknowledgeRequest(group_id="hg", member_id="m-1", share_session_epoch=0, topics=()),
    )
    assert r.error_code == ErrorCode.invalid_share_session_epoch
    # a broker that does not lead the partition says who does
    other = next(b for b in (1, 2, 3) if b != leaders[0])
    r = _call(
        cluster.port + other - 1,
        fetch_v1.ShareFetchRequest(
            group_id="hg",
            member_id="m-3",
            share_session_epoch=0,
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=1,
            max_bytes=1 << 20,
            max_records=100,
            batch_size=100,
            topics=(
                fetch_v1.FetchTopic(
                    topic_id=topic_id,
                    partitions=(fetch_v1.FetchPartition(partition_index=0, acknowledgement_batches=()),),
                ),
            ),
            forgotten_topics_data=(),
        ),
    )
    for s in _CONNECTIONS.values():
        s.close()
    _CONNECTIONS.clear()
    part = r.responses[0].partitions[0]
    assert part.error_code == ErrorCode.not_leader_or_follower
    assert part.current_leader.leader_id == leaders[0]
    assert [e.node_id for e in r.node_endpoints] == [leaders[0]]


def test_partitions_moving_between_brokers_under_share_consumers_lose_and_repeat_nothing(share_cluster, e2e):
    """Both partitions are moved to other brokers twice while two share consumers work: each
    old leader writes the state once more, the new one loads it; every record is accepted
    exactly once."""
    from kafka import KafkaAdminClient
    from kafka.structs import TopicPartition

    cluster = share_cluster
    topic, group = e2e.topic_name("move"), f"sg-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=2)
    stop = threading.Event()
    members = [Survivor(cluster.bootstrap, group, topic, stop) for _ in range(2)]
    for m in members:
        m.start()
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    values = [f"m{i}".encode() for i in range(400)]
    try:
        deadline = time.monotonic() + 60
        while _state_objects(cluster, group) < 2:
            assert time.monotonic() < deadline, "the share group never fetched both partitions"
            time.sleep(0.1)
        for chunk in range(4):
            e2e.produce(cluster.bootstrap, topic, values[chunk * 100 : (chunk + 1) * 100])
            if chunk in (1, 2):
                leaders = e2e.wait_for_leaders(cluster.bootstrap, topic, 2)
                for partition, leader in leaders.items():
                    target = leader % 3 + 1
                    result = admin.alter_partition_reassignments({TopicPartition(topic, partition): [target]})
                    assert result[TopicPartition(topic, partition)] is None, result
                moved = time.monotonic() + 30
                while time.monotonic() < moved:
                    now = e2e.wait_for_leaders(cluster.bootstrap, topic, 2)
                    if all(now[p] != leaders[p] for p in leaders):
                        break
                    time.sleep(0.1)
                assert all(now[p] != leaders[p] for p in leaders), f"leaders did not move: {leaders} -> {now}"
        deadline = time.monotonic() + 120
        while sum(sum(m.accepted.values()) for m in members) < len(values) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        stop.set()
        for m in members:
            m.join(60)
        admin.close()
    total: Counter[bytes] = Counter()
    for m in members:
        total.update(m.accepted)
    assert set(total) == set(values), f"never accepted: {sorted(set(values) - set(total))[:5]}"
    assert all(n == 1 for n in total.values()), [v for v, n in total.items() if n > 1][:5]
    # the state followed the partitions: written by the leaders after both moves, and at the end
    from automq.broker.kafka.share.state_store import decode, group_prefix

    root = Path(cluster.data_dir) / "objects" / group_prefix(group)
    states = [decode(f.read_bytes()) for f in root.glob("*%obj")]
    assert len(states) == 2 and all(st.leader_epoch >= 2 for st in states), states
    assert sum(st.start_offset for st in states) == len(values), states


_HALF_ACKER = r"""
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
while True:
    batch = [m for m in c.poll(0.5) if m.error() is None]
    if not batch:
        print("POLL", flush=True)
        continue
    half = batch[: len(batch) // 2]
    for m in half:
        c.acknowledge(m)
    result = c.commit_sync(30)
    assert all(err is None for err in result.values()), result
    print("ACKED " + ",".join(m.value().decode() for m in half), flush=True)
    print("HELD " + ",".join(m.value().decode() for m in batch[len(half):]), flush=True)
    time.sleep(3600)
"""


def test_a_broker_killed_9_loses_locks_but_no_acknowledgement(share_cluster, e2e):
    """Runs last: it kills a broker of the module's cluster (the launcher restarts it)."""
    cluster = share_cluster
    topic, group = e2e.topic_name("crash"), f"sg-{uuid.uuid4().hex[:8]}"
    e2e.create_topic(cluster.bootstrap, topic, partitions=1)
    leader = e2e.wait_for_leaders(cluster.bootstrap, topic, 1)[0]
    holder = subprocess.Popen(
        [sys.executable, "-c", _HALF_ACKER, cluster.bootstrap, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout is not None
        _wait_fetching(cluster, group, 1, lambda: holder.stdout.readline())  # type: ignore[union-attr]
        values = [f"c{i}".encode() for i in range(200)]
        e2e.produce(cluster.bootstrap, topic, values)
        acked: set[bytes] = set()
        held: set[bytes] = set()
        while not held:
            line = holder.stdout.readline()
            assert line, "the consumer exited"
            if line.startswith("ACKED "):
                acked = {v.encode() for v in line.split()[1].split(",")} if line.split()[1:] else set()
            if line.startswith("HELD "):
                held = {v.encode() for v in line.split()[1].split(",")}
        assert acked
        old_pid = cluster.kill9(f"broker-{leader}")  # the leader dies holding the locks
        holder.kill()
        holder.wait(10)
        cluster.wait_restarted(f"broker-{leader}", old_pid)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    stop = threading.Event()
    survivor = Survivor(cluster.bootstrap, group, topic, stop)
    survivor.start()
    deadline = time.monotonic() + 120
    expected = set(values) - acked
    while set(survivor.accepted) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    stop.set()
    survivor.join(60)
    assert set(survivor.accepted) == expected, (
        f"missing {len(expected - set(survivor.accepted))}, acknowledged before the crash and delivered again: "
        f"{sorted(set(survivor.accepted) & acked)[:5]}"
    )
    assert all(n == 1 for n in survivor.accepted.values())
    assert survivor.redelivered >= len(held)  # the records locked at the crash came back
