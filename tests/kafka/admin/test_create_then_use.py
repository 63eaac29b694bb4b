"""CreateTopics and CreatePartitions answer once every live broker serves the new metadata and
the new partitions are open on their leaders: the very next Metadata or Produce on any broker,
with no client retry, finds them (and DeleteTopics once no broker serves the topic any more). The second broker follows metadata half a second late here,
so answering at the controller's commit (as Kafka does) would fail this test every time."""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct

from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec


def _call(port: int, request):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
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
    return codec.decode_response(body, type(request))[1]


def _metadata(port: int, topic: str):
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

    return _call(
        port,
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
    )


def _create(port: int, topic: str, partitions: int):
    from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest

    return _call(
        port,
        CreateTopicsRequest(
            topics=(
                CreatableTopic(name=topic, num_partitions=partitions, replication_factor=1, assignments=(), configs=()),
            ),
            timeout=datetime.timedelta(seconds=30),
            validate_only=False,
        ),
    )


def _grow(port: int, topic: str, count: int):
    from kio.schema.create_partitions.v3.request import CreatePartitionsRequest, CreatePartitionsTopic

    return _call(
        port,
        CreatePartitionsRequest(
            topics=(CreatePartitionsTopic(name=topic, count=count, assignments=None),),
            timeout=datetime.timedelta(seconds=30),
            validate_only=False,
        ),
    )


def _produce(port: int, topic: str, partition: int, batch: bytes):
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    response = _call(
        port,
        ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=partition, records=batch),)),
            ),
        ),
    )
    return response.responses[0].partition_responses[0].error_code


def _batch() -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(0, timestamp=1_700_000_000_000, key=None, value=b"v", headers=[])
    return bytes(builder.build())


def test_create_then_use_on_another_broker_without_retries(inprocess_cluster):
    cluster = inprocess_cluster
    first_port, second_port = cluster.ports
    late = cluster.brokers[1]
    follow = late.cluster.watch_metadata

    async def late_watch(*args, **kwargs):
        image = await follow(*args, **kwargs)
        await asyncio.sleep(0.5)  # a broker that applies metadata late (busy, far away)
        return image

    late.cluster.watch_metadata = late_watch  # type: ignore[method-assign]
    # a first change makes the second broker's long poll in flight return, so the next is late
    assert _create(first_port, "warm-up", 1).topics[0].error_code == ErrorCode.none

    created = _create(first_port, "fresh", 4)
    assert created.topics[0].error_code == ErrorCode.none
    answer = _metadata(second_port, "fresh")  # at once, on the other broker
    (topic,) = answer.topics
    assert topic.error_code == ErrorCode.none, topic
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    assert sorted(leaders) == [0, 1, 2, 3] and all(leader in (1, 2) for leader in leaders.values())
    port_of = {1: first_port, 2: second_port}
    batch = _batch()
    assert [_produce(port_of[leaders[i]], "fresh", i, batch) for i in range(4)] == [ErrorCode.none] * 4

    grown = _grow(first_port, "fresh", 6)
    assert grown.results[0].error_code == ErrorCode.none
    (topic,) = _metadata(second_port, "fresh").topics
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    assert sorted(leaders) == list(range(6))
    assert [_produce(port_of[leaders[i]], "fresh", i, batch) for i in (4, 5)] == [ErrorCode.none] * 2

    from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState

    deleted = _call(
        first_port,
        DeleteTopicsRequest(
            topics=(DeleteTopicState(name="fresh", topic_id=None),), timeout=datetime.timedelta(seconds=30)
        ),
    )
    assert deleted.responses[0].error_code == ErrorCode.none
    (gone,) = _metadata(second_port, "fresh").topics  # the other broker no longer serves it
    assert gone.error_code == ErrorCode.unknown_topic_or_partition
