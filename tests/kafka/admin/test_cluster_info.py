"""ElectLeaders, DescribeTopicPartitions (KIP-966), DescribeQuorum, AlterReplicaLogDirs and the
KIP-714 telemetry pair, with kafka-python's and confluent-kafka's admin clients (and librdkafka's
own telemetry requests) against an in-process two-broker cluster."""

from __future__ import annotations

import datetime
import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.controller.protocol import PartitionInfo, TopicInfo
from automq.broker.kafka.handlers import cluster_info


def _admin(cluster):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=20_000)


def _topic(cluster, name: str, partitions: int) -> None:
    from kafka.admin import NewTopic

    admin = _admin(cluster)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
    deadline = time.monotonic() + 20
    while not all(
        (t := b.partitions.topic(name)) is not None and all(p.leader >= 0 for p in t.partitions)
        for b in cluster.brokers
    ):
        assert time.monotonic() < deadline, f"{name} not everywhere"
        time.sleep(0.05)


def test_elect_leaders_is_never_needed_for_a_led_partition(inprocess_cluster):
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient
    from kafka.errors import UnknownTopicOrPartitionError

    cluster = inprocess_cluster
    _topic(cluster, "elect", 2)
    admin = _admin(cluster)
    try:
        response = admin.elect_leaders(0, {"elect": [0, 1]}, raise_errors=False)
        codes = {p.partition_id: p.error_code for r in response.replica_election_results for p in r.partition_result}
        assert codes == {0: ErrorCode.election_not_needed, 1: ErrorCode.election_not_needed}
        # kafka-python names every partition when asked for all: each is answered
        everything = admin.elect_leaders(1, None, raise_errors=False)
        assert {p.error_code for r in everything.replica_election_results for p in r.partition_result} == {
            ErrorCode.election_not_needed
        }
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.elect_leaders(0, {"elect": [7]})
    finally:
        admin.close()
    rd = AdminClient({"bootstrap.servers": cluster.bootstrap})
    result = rd.elect_leaders(ElectionType.PREFERRED, [TopicPartition("elect", 0)]).result(30)
    (error,) = result.values()
    assert error is not None and error.code() == ErrorCode.election_not_needed
    # all partitions (null on the wire): only those an election was attempted for are reported
    assert rd.elect_leaders(ElectionType.UNCLEAN, None).result(30) == {}
    del rd  # librdkafka's threads go now, not after the cluster (reconnect noise)


def test_election_of_a_partition_without_leader_is_refused_honestly():
    offline = TopicInfo("t", "id", (PartitionInfo("t", 0, 5, -1, 3, "offline", -1),), {})
    led_by_fenced = TopicInfo("t", "id", (PartitionInfo("t", 0, 5, 2, 3, "online", -1),), {})
    assert cluster_info.election_result(offline, 0, {1}, cluster_info.PREFERRED)[0] == (
        ErrorCode.preferred_leader_not_available
    )
    code, message = cluster_info.election_result(offline, 0, {1}, cluster_info.UNCLEAN)
    assert code == ErrorCode.eligible_leaders_not_available and "lose acknowledged" in message
    assert cluster_info.election_result(led_by_fenced, 0, {1}, cluster_info.PREFERRED)[0] == (
        ErrorCode.preferred_leader_not_available
    )
    assert cluster_info.election_result(None, 0, {1}, cluster_info.PREFERRED)[0] == ErrorCode.unknown_topic_or_partition


def test_paging_by_partitions_and_cursor():
    counts = {"a": 3, "b": 3, "c": 1}
    page, cursor = cluster_info.page_topics(["c", "a", "b"], counts, None, 4)
    assert page == [("a", range(0, 3)), ("b", range(0, 1))] and cursor == ("b", 1)
    page, cursor = cluster_info.page_topics(["c", "a", "b"], counts, cursor, 2)
    assert page == [("b", range(1, 3))] and cursor == ("c", 0)
    page, cursor = cluster_info.page_topics(["c", "a", "b"], counts, cursor, 2)
    assert page == [("c", range(0, 1))] and cursor is None
    assert cluster_info.page_topics(["a"], counts, None, 3) == ([("a", range(0, 3))], None)


def test_describe_topic_partitions_pages_with_a_cursor(inprocess_cluster):
    cluster = inprocess_cluster
    _topic(cluster, "dtp-a", 3)
    _topic(cluster, "dtp-b", 3)
    admin = _admin(cluster)
    try:
        first = admin.describe_topic_partitions(["dtp-b", "dtp-a", "dtp-missing"], response_partition_limit=4)
        by_name = {t["name"]: t for t in first["topics"]}
        assert by_name["dtp-missing"]["error_code"] == ErrorCode.unknown_topic_or_partition
        assert [p["partition_index"] for p in by_name["dtp-a"]["partitions"]] == [0, 1, 2]
        assert [p["partition_index"] for p in by_name["dtp-b"]["partitions"]] == [0]
        assert first["next_cursor"] == {"topic_name": "dtp-b", "partition_index": 1}
        rest = admin.describe_topic_partitions(["dtp-a", "dtp-b"], cursor=first["next_cursor"])
        assert [t["name"] for t in rest["topics"]] == ["dtp-b"]
        assert [p["partition_index"] for p in rest["topics"][0]["partitions"]] == [1, 2]
        assert rest["next_cursor"] is None
        info = cluster.brokers[0].partitions.topic("dtp-b")
        for p in rest["topics"][0]["partitions"]:
            want = info.partitions[p["partition_index"]]
            assert (p["leader_id"], p["leader_epoch"]) == (want.leader, want.leader_epoch)
            assert p["replica_nodes"] == p["isr_nodes"] == [want.leader]  # the one honest replica
            assert p["error_code"] == 0
        # a cursor naming a topic outside the request is refused, as Kafka does
        bad = admin.describe_topic_partitions(["dtp-a"], cursor={"topic_name": "dtp-b", "partition_index": 0})
        assert [t["error_code"] for t in bad["topics"]] == [ErrorCode.invalid_request]
    finally:
        admin.close()


def test_describe_metadata_quorum_reports_the_controllers(inprocess_cluster):
    cluster = inprocess_cluster
    admin = _admin(cluster)
    try:
        quorum = admin.describe_metadata_quorum()
    finally:
        admin.close()
    (topic,) = quorum["topics"]
    assert topic["topic_name"] == "__cluster_metadata"
    (partition,) = topic["partitions"]
    assert partition["error"] is None
    assert partition["leader_id"] == 0  # the in-process controller's node id
    assert partition["leader_epoch"] >= 1  # its term
    assert partition["high_watermark"] >= 0
    assert [v["replica_id"] for v in partition["current_voters"]] == [0]
    assert sorted(o["replica_id"] for o in partition["observers"]) == [1, 2]
    (node,) = quorum["nodes"]
    assert node["node_id"] == 0 and node["listeners"][0]["port"] > 0


def test_alter_replica_log_dirs_has_one_dir(inprocess_cluster):
    from kafka import TopicPartitionReplica
    from kafka.errors import LogDirNotFoundError, NoError, ReplicaNotAvailableError

    cluster = inprocess_cluster
    _topic(cluster, "dirs", 1)
    leader = cluster.brokers[0].partitions.topic("dirs").partitions[0].leader
    other = 1 if leader == 2 else 2
    admin = _admin(cluster)
    try:
        # the dir DescribeLogDirs names (the object store) is the one a replica can be "moved" to
        (described,) = admin.describe_log_dirs(brokers=[leader])
        (here,) = [d["log_dir"] for d in described["log_dirs"]]
        result = admin.alter_replica_log_dirs(
            {
                TopicPartitionReplica("dirs", 0, leader): here,
                TopicPartitionReplica("dirs", 0, other): here,
            }
        )
        moved = admin.alter_replica_log_dirs({TopicPartitionReplica("dirs", 0, leader): "/elsewhere"})
    finally:
        admin.close()
    assert result[TopicPartitionReplica("dirs", 0, leader)] is NoError
    assert result[TopicPartitionReplica("dirs", 0, other)] is ReplicaNotAvailableError
    assert moved[TopicPartitionReplica("dirs", 0, leader)] is LogDirNotFoundError


def _requests(cluster, api: str) -> float:
    return sum(b.metrics.registry.get_sample_value("kafka_requests_total", {"api": api}) or 0 for b in cluster.brokers)


def test_librdkafka_gets_a_subscription_and_pushes_nothing(inprocess_cluster):
    from confluent_kafka import Producer

    cluster = inprocess_cluster
    _topic(cluster, "telemetry", 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.metrics.push": True})
    try:
        producer.produce("telemetry", b"x")
        assert producer.flush(20) == 0
        deadline = time.monotonic() + 20
        while _requests(cluster, "GetTelemetrySubscriptions") < 1:
            assert time.monotonic() < deadline, "librdkafka never asked for a telemetry subscription"
            producer.poll(0.1)
        for _ in range(10):  # would it push? (nothing is requested, so it must not)
            producer.poll(0.1)
    finally:
        producer.flush(5)
        del producer
    assert _requests(cluster, "PushTelemetry") == 0


def _call(port: int, request):
    """One request over a plain socket, as a client would send it."""
    import socket
    import struct

    from automq.broker.kafka import codec

    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        frame = codec.encode_request(1, request)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        head = b""
        while len(head) < 4:
            head += sock.recv(4 - len(head))
        size = struct.unpack(">i", head)[0]
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            assert chunk, "connection closed"
            body += chunk
    _cid, response = codec.decode_response(body, type(request))
    return response


def test_telemetry_answers_on_the_wire(inprocess_cluster):
    from kio.schema.get_telemetry_subscriptions.v0.request import GetTelemetrySubscriptionsRequest
    from kio.schema.push_telemetry.v0.request import PushTelemetryRequest

    port = inprocess_cluster.ports[0]
    sub = _call(port, GetTelemetrySubscriptionsRequest(client_instance_id=uuid.UUID(int=0)))
    assert sub.error_code == ErrorCode.none and sub.client_instance_id.int != 0
    assert sub.requested_metrics == () and sub.push_interval >= datetime.timedelta(minutes=1)
    again = _call(port, GetTelemetrySubscriptionsRequest(client_instance_id=sub.client_instance_id))
    assert again.client_instance_id == sub.client_instance_id  # a named client keeps its id

    def push(**kw):
        values = dict(
            client_instance_id=sub.client_instance_id,
            subscription_id=sub.subscription_id,
            terminating=False,
            compression_type=0,
            metrics=b"",
        )
        values.update(kw)
        return _call(port, PushTelemetryRequest(**values)).error_code

    assert push() == ErrorCode.none
    assert push(subscription_id=sub.subscription_id + 1) == ErrorCode.unknown_subscription_id
    assert push(client_instance_id=uuid.UUID(int=0)) == ErrorCode.invalid_request
    assert push(compression_type=9) == ErrorCode.unsupported_compression_type
    assert push(metrics=b"x" * (cluster_info.TELEMETRY_MAX_BYTES + 1)) == ErrorCode.telemetry_too_large


def test_list_config_resources(inprocess_cluster):
    cluster = inprocess_cluster
    _topic(cluster, "cfg-listed", 1)
    admin = _admin(cluster)
    try:
        everything = admin.list_config_resources()
        topics_only = admin.list_config_resources(["TOPIC"])
        groups = admin.list_config_resources(["GROUP"])
    finally:
        admin.close()
    assert everything == {"topic": topics_only["topic"], "broker": ["1", "2"]}
    assert "cfg-listed" in topics_only["topic"] and list(topics_only) == ["topic"]
    assert groups == {}  # no group has configs of its own here


@pytest.mark.parametrize(
    "inprocess_cluster",
    [{"brokers": 1, "kafka": {"authorizer_class_name": "standard", "allow_everyone_if_no_acl_found": False}}],
    indirect=True,
)
def test_new_apis_are_refused_without_acls(inprocess_cluster):
    """With the authorizer on and no ACL, an anonymous client learns nothing through them."""
    from kio.schema.alter_replica_log_dirs.v2.request import (
        AlterReplicaLogDir,
        AlterReplicaLogDirsRequest,
        AlterReplicaLogDirTopic,
    )
    from kio.schema.describe_quorum.v2.request import DescribeQuorumRequest
    from kio.schema.describe_quorum.v2.request import PartitionData as QuorumPartition
    from kio.schema.describe_quorum.v2.request import TopicData as QuorumTopic
    from kio.schema.describe_topic_partitions.v0.request import DescribeTopicPartitionsRequest, TopicRequest
    from kio.schema.elect_leaders.v2.request import ElectLeadersRequest
    from kio.schema.elect_leaders.v2.request import TopicPartitions as ElectTopic
    from kio.schema.list_config_resources.v1.request import ListConfigResourcesRequest
    from kio.schema.offset_for_leader_epoch.v4.request import (
        OffsetForLeaderEpochRequest,
        OffsetForLeaderPartition,
        OffsetForLeaderTopic,
    )

    cluster = inprocess_cluster
    cluster.run(cluster.brokers[0].ensure_topic("secret", 1, {}))
    port = cluster.ports[0]
    denied_cluster = ErrorCode.cluster_authorization_failed
    elect = _call(
        port,
        ElectLeadersRequest(
            election_type=0,
            topic_partitions=(ElectTopic(topic="secret", partitions=(0,)),),
            timeout=datetime.timedelta(seconds=5),
        ),
    )
    assert elect.error_code == denied_cluster
    quorum = _call(
        port,
        DescribeQuorumRequest(
            topics=(QuorumTopic(topic_name="__cluster_metadata", partitions=(QuorumPartition(partition_index=0),)),)
        ),
    )
    assert quorum.error_code == denied_cluster and quorum.topics == ()
    listed = _call(port, ListConfigResourcesRequest(resource_types=()))
    assert listed.error_code == denied_cluster and listed.config_resources == ()
    dirs = _call(
        port,
        AlterReplicaLogDirsRequest(
            dirs=(AlterReplicaLogDir(path="/x", topics=(AlterReplicaLogDirTopic(name="secret", partitions=(0,)),)),)
        ),
    )
    assert dirs.results[0].partitions[0].error_code == denied_cluster
    described = _call(
        port,
        DescribeTopicPartitionsRequest(topics=(TopicRequest(name="secret"),), response_partition_limit=10, cursor=None),
    )
    assert [(t.name, t.error_code, t.partitions) for t in described.topics] == [
        ("secret", ErrorCode.topic_authorization_failed, ())
    ]
    everything = _call(port, DescribeTopicPartitionsRequest(topics=(), response_partition_limit=10, cursor=None))
    assert everything.topics == ()  # a listing of all topics leaves out what may not be described
    epochs = _call(
        port,
        OffsetForLeaderEpochRequest(
            replica_id=-1,
            topics=(
                OffsetForLeaderTopic(
                    topic="secret",
                    partitions=(OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0),),
                ),
            ),
        ),
    )
    (answer,) = epochs.topics[0].partitions
    assert (answer.error_code, answer.end_offset) == (ErrorCode.topic_authorization_failed, -1)
