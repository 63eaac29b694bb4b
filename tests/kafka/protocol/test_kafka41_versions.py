"""The Kafka 4.1/4.2 versions the broker advertises, spoken with raw kio frames to a real broker:
Produce v13 names topics by id (KIP-516) in request and response, and an id the broker does not
know (the zero id included) is answered UNKNOWN_TOPIC_ID while the rest of the request succeeds.
Both decoders are exercised: kio's for small frames, the in-place one for frames over 64 KiB."""

from __future__ import annotations

import datetime
import socket
import struct
import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.kafka import codec
from automq.broker.kafka.handlers.registry import served_ranges

pytestmark = pytest.mark.timeout(120)


def _call(port: int, request, correlation_id: int = 7):
    frame = codec.encode_request(correlation_id, request)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            assert chunk, "broker closed the connection"
            head += chunk
        (size,) = struct.unpack(">i", head)
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            assert chunk, "broker closed the connection"
            body += chunk
    got_id, response = codec.decode_response(body, type(request))
    assert got_id == correlation_id
    return response


def _create(port: int, name: str, partitions: int = 2) -> uuid.UUID:
    from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest

    response = _call(
        port,
        CreateTopicsRequest(
            topics=(
                CreatableTopic(name=name, num_partitions=partitions, replication_factor=1, assignments=(), configs=()),
            ),
            timeout=datetime.timedelta(seconds=30),
            validate_only=False,
        ),
    )
    (result,) = response.topics
    assert result.error_code == ErrorCode.none, result
    assert result.topic_id is not None
    return result.topic_id


def _batch(values: list[bytes]) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=b"k%d" % i, value=value, headers=[])
    return bytes(builder.build())


def _produce_v13(port: int, topics: list[tuple[uuid.UUID | None, list[tuple[int, bytes]]]], acks: int = -1):
    from kio.schema.produce.v13.request import PartitionProduceData, ProduceRequest, TopicProduceData

    return _call(
        port,
        ProduceRequest(
            transactional_id=None,
            acks=acks,
            timeout=datetime.timedelta(seconds=20),
            topic_data=tuple(
                TopicProduceData(
                    topic_id=topic_id,
                    partition_data=tuple(PartitionProduceData(index=i, records=r) for i, r in parts),
                )
                for topic_id, parts in topics
            ),
        ),
    )


def _fetch_values(port: int, topic_id: uuid.UUID, partition: int, version: int = 17) -> list[bytes]:
    import importlib

    from kafka.record.default_records import DefaultRecordBatch

    schema = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    response = _call(
        port,
        schema.FetchRequest(
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=0,
            topics=(
                schema.FetchTopic(
                    topic_id=topic_id,
                    partitions=(
                        schema.FetchPartition(partition=partition, fetch_offset=0, partition_max_bytes=1 << 22),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        ),
    )
    (topic,) = response.responses
    assert topic.topic_id == topic_id
    (part,) = topic.partitions
    assert part.error_code == ErrorCode.none, part
    data = bytes(part.records or b"")
    values: list[bytes] = []
    position = 0
    while position + 12 <= len(data):
        (length,) = struct.unpack_from(">i", data, position + 8)
        batch = DefaultRecordBatch(data[position : position + 12 + length])
        values.extend(bytes(record.value) for record in batch)
        position += 12 + length
    return values


def test_produce_v13_is_advertised():
    assert served_ranges()[0] == (3, 13)


@pytest.mark.parametrize("size", [16, 100_000], ids=["small-frame", "large-frame"])
def test_produce_v13_names_topics_by_id(fuzz_broker, size):
    """Records land in the topic the id names; the response names the topic by the same id."""
    port = fuzz_broker.port
    name = f"p13-{size}"
    topic_id = _create(port, name)
    values = [bytes([65 + i]) * size for i in range(3)]
    response = _produce_v13(port, [(topic_id, [(1, _batch(values))])])
    (topic,) = response.responses
    assert topic.topic_id == topic_id
    (part,) = topic.partition_responses
    assert (part.index, part.error_code, part.base_offset) == (1, ErrorCode.none, 0)
    assert part.log_start_offset == 0
    assert _fetch_values(port, topic_id, 1) == values
    # a second produce continues the log; partition 0 stayed empty
    again = _produce_v13(port, [(topic_id, [(1, _batch([b"z"]))])])
    assert again.responses[0].partition_responses[0].base_offset == 3
    assert _fetch_values(port, topic_id, 0) == []


@pytest.mark.parametrize("size", [16, 100_000], ids=["small-frame", "large-frame"])
def test_produce_v13_unknown_and_zero_topic_ids(fuzz_broker, size):
    """Unknown ids and the zero id get UNKNOWN_TOPIC_ID under their own id; the known topic in
    the same request is written, and nothing is written for the others."""
    port = fuzz_broker.port
    known = _create(port, f"p13-mixed-{size}", partitions=1)
    stranger = uuid.uuid4()
    zero = uuid.UUID(int=0)
    batch = _batch([b"m" * size])
    response = _produce_v13(port, [(stranger, [(0, batch), (3, batch)]), (known, [(0, batch)]), (zero, [(0, batch)])])
    by_id = {t.topic_id: t.partition_responses for t in response.responses}
    # kio reads the zero id as None
    assert set(by_id) == {stranger, known, None}
    assert [(p.index, p.error_code, p.base_offset) for p in by_id[stranger]] == [
        (0, ErrorCode.unknown_topic_id, -1),
        (3, ErrorCode.unknown_topic_id, -1),
    ]
    assert [(p.index, p.error_code) for p in by_id[None]] == [(0, ErrorCode.unknown_topic_id)]
    assert [(p.index, p.error_code, p.base_offset) for p in by_id[known]] == [(0, ErrorCode.none, 0)]
    assert _fetch_values(port, known, 0) == [b"m" * size]
    fuzz_broker.assert_serving()


def test_produce_v13_unknown_partition_of_known_topic(fuzz_broker):
    port = fuzz_broker.port
    topic_id = _create(port, "p13-partitions", partitions=1)
    response = _produce_v13(port, [(topic_id, [(5, _batch([b"x"])), (-1, _batch([b"y"]))])])
    codes = [(p.index, p.error_code) for p in response.responses[0].partition_responses]
    assert codes == [(5, ErrorCode.unknown_topic_or_partition), (-1, ErrorCode.unknown_topic_or_partition)]


def test_produce_v12_still_names_topics(fuzz_broker):
    from kio.schema.produce.v12.request import PartitionProduceData, ProduceRequest, TopicProduceData

    port = fuzz_broker.port
    topic_id = _create(port, "p12-by-name", partitions=1)
    response = _call(
        port,
        ProduceRequest(
            transactional_id=None,
            acks=1,
            timeout=datetime.timedelta(seconds=20),
            topic_data=(
                TopicProduceData(
                    name="p12-by-name", partition_data=(PartitionProduceData(index=0, records=_batch([b"old"])),)
                ),
            ),
        ),
    )
    (topic,) = response.responses
    assert topic.name == "p12-by-name"
    assert topic.partition_responses[0].error_code == ErrorCode.none
    assert _fetch_values(port, topic_id, 0) == [b"old"]


def test_produce_v13_truncated_topic_id_is_a_decode_error():
    """A large v13 frame cut inside a topic id is refused by the in-place decoder, not misread."""
    from kio.schema.produce.v13.request import PartitionProduceData, ProduceRequest, TopicProduceData

    request = ProduceRequest(
        transactional_id="t" * 70_000,  # makes the frame large without records
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            TopicProduceData(topic_id=uuid.uuid4(), partition_data=(PartitionProduceData(index=0, records=None),)),
        ),
    )
    frame = codec.encode_request(3, request)
    whole = codec.decode_request(bytearray(frame), {0: (3, 13)})
    assert whole.request.topic_data[0].topic_id == request.topic_data[0].topic_id
    assert whole.request.topic_data[0].name is None
    cut = len(frame) - 16  # 9 bytes follow the topic id: the cut ends inside it
    with pytest.raises(codec.RequestDecodeError):
        codec.decode_request(bytearray(frame[:cut]), {0: (3, 13)})


def _fetch_v18(port: int, topics, *, session_id: int = 0, session_epoch: int = -1, forgotten=()):
    from kio.schema.fetch.v18.request import FetchPartition, FetchRequest, FetchTopic

    return _call(
        port,
        FetchRequest(
            max_wait=datetime.timedelta(milliseconds=0),
            min_bytes=0,
            session_id=session_id,
            session_epoch=session_epoch,
            topics=tuple(
                FetchTopic(
                    topic_id=topic_id,
                    partitions=tuple(
                        # v18's high_watermark is a follower's (KIP-1166); a consumer leaves it at
                        # its default, and a value sent anyway changes nothing for a consumer
                        FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=1 << 20, high_watermark=hw)
                        for p, o, hw in parts
                    ),
                )
                for topic_id, parts in topics
            ),
            forgotten_topics_data=forgotten,
        ),
    )


def test_fetch_v18_is_advertised():
    assert served_ranges()[1] == (4, 18)


def test_fetch_v18_reads_by_topic_id(fuzz_broker):
    port = fuzz_broker.port
    topic_id = _create(port, "f18", partitions=1)
    _produce_v13(port, [(topic_id, [(0, _batch([b"a", b"b", b"c"]))])])
    assert _fetch_values(port, topic_id, 0, version=18) == [b"a", b"b", b"c"]
    for follower_hw in (2**63 - 1, -1, 1, 10**9):
        response = _fetch_v18(port, [(topic_id, [(0, 1, follower_hw)])])
        (part,) = response.responses[0].partitions
        assert (part.error_code, part.high_watermark, part.log_start_offset) == (ErrorCode.none, 3, 0)
        assert part.records  # from offset 1: the batch holding it


def test_fetch_v18_unknown_and_zero_topic_ids(fuzz_broker):
    port = fuzz_broker.port
    known = _create(port, "f18-mixed", partitions=1)
    _produce_v13(port, [(known, [(0, _batch([b"k"]))])])
    stranger = uuid.uuid4()
    response = _fetch_v18(port, [(stranger, [(0, 0, -1)]), (known, [(0, 0, -1)]), (uuid.UUID(int=0), [(0, 0, -1)])])
    by_id = {t.topic_id: t.partitions for t in response.responses}
    assert set(by_id) == {stranger, known, None}
    assert [p.error_code for p in by_id[stranger]] == [ErrorCode.unknown_topic_id]
    assert [p.error_code for p in by_id[None]] == [ErrorCode.unknown_topic_id]
    assert [(p.error_code, p.high_watermark) for p in by_id[known]] == [(ErrorCode.none, 1)]
    fuzz_broker.assert_serving()


def test_fetch_v18_incremental_session(fuzz_broker):
    """A v18 fetch session (KIP-227) keyed by topic id: the second, incremental fetch names no
    partitions and still answers the one whose high watermark moved."""
    port = fuzz_broker.port
    topic_id = _create(port, "f18-session", partitions=1)
    first = _fetch_v18(port, [(topic_id, [(0, 0, -1)])], session_epoch=0)
    assert first.error_code == ErrorCode.none and first.session_id != 0
    _produce_v13(port, [(topic_id, [(0, _batch([b"s"]))])])
    second = _fetch_v18(port, [], session_id=first.session_id, session_epoch=1)
    assert second.error_code == ErrorCode.none
    (topic,) = second.responses
    assert topic.topic_id == topic_id
    assert [(p.partition_index, p.high_watermark) for p in topic.partitions] == [(0, 1)]


def _list_offsets(port: int, version: int, name: str, timestamps: list[int]):
    import importlib

    schema = importlib.import_module(f"kio.schema.list_offsets.v{version}.request")
    response = _call(
        port,
        codec.build(
            schema.ListOffsetsRequest,
            replica_id=-1,
            isolation_level=0,
            timeout=datetime.timedelta(seconds=5),
            topics=(
                schema.ListOffsetsTopic(
                    name=name,
                    partitions=tuple(schema.ListOffsetsPartition(partition_index=0, timestamp=t) for t in timestamps),
                ),
            ),
        ),
    )
    (topic,) = response.topics
    return [(p.error_code, p.offset, p.timestamp) for p in topic.partitions]


def test_list_offsets_v11_is_advertised():
    assert served_ranges()[2] == (1, 11)


def test_list_offsets_v11_earliest_pending_upload(fuzz_broker):
    """-6 (KIP-1023): nothing here waits for a tier upload, so it is answered as Kafka answers a
    topic without remote storage; the other sentinels are unchanged in v11."""
    port = fuzz_broker.port
    topic_id = _create(port, "lo11", partitions=1)
    _produce_v13(port, [(topic_id, [(0, _batch([b"a", b"b"]))])])
    answers = _list_offsets(port, 11, "lo11", [-6, -1, -2, -4])
    assert answers == [
        (ErrorCode.none, -1, -1),
        (ErrorCode.none, 2, -1),
        (ErrorCode.none, 0, -1),
        (ErrorCode.none, 0, -1),
    ]


@pytest.mark.parametrize(("version", "timestamp"), [(10, -6), (8, -5), (7, -4), (6, -3)])
def test_list_offsets_sentinel_older_than_its_version_is_unsupported(fuzz_broker, version, timestamp):
    port = fuzz_broker.port
    name = f"lo-old-{version}"
    _create(port, name, partitions=1)
    assert _list_offsets(port, version, name, [timestamp, -1]) == [
        (ErrorCode.unsupported_version, -1, -1),
        (ErrorCode.none, 0, -1),
    ]


def _commit_v10(port: int, group: str, topics: list[tuple[uuid.UUID | None, list[tuple[int, int]]]]):
    from kio.schema.offset_commit.v10.request import (
        OffsetCommitRequest,
        OffsetCommitRequestPartition,
        OffsetCommitRequestTopic,
    )

    request = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=tuple(
            OffsetCommitRequestTopic(
                topic_id=topic_id,
                partitions=tuple(
                    OffsetCommitRequestPartition(partition_index=p, committed_offset=o, committed_metadata="m")
                    for p, o in parts
                ),
            )
            for topic_id, parts in topics
        ),
    )
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
    from kio.static.primitive import i8

    # FindCoordinator creates __consumer_offsets; the coordinator may still be loading it
    _call(port, FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group,)))
    for _ in range(100):
        response = _call(port, request)
        codes = {p.error_code for t in response.topics for p in t.partitions}
        if not codes & {
            ErrorCode.coordinator_load_in_progress,
            ErrorCode.coordinator_not_available,
            ErrorCode.not_coordinator,
        }:
            return response
        time.sleep(0.1)
    raise AssertionError(f"coordinator never ready: {response}")


def _fetch_offsets_v10(port: int, group: str, topics: list[tuple[uuid.UUID | None, list[int]]] | None):
    from kio.schema.offset_fetch.v10.request import (
        OffsetFetchRequest,
        OffsetFetchRequestGroup,
        OffsetFetchRequestTopics,
    )

    response = _call(
        port,
        OffsetFetchRequest(
            groups=(
                OffsetFetchRequestGroup(
                    group_id=group,
                    topics=None
                    if topics is None
                    else tuple(OffsetFetchRequestTopics(topic_id=t, partition_indexes=tuple(ps)) for t, ps in topics),
                ),
            ),
        ),
    )
    (answer,) = response.groups
    assert answer.error_code == ErrorCode.none, answer
    return {
        t.topic_id: [(p.partition_index, p.committed_offset, p.error_code) for p in t.partitions] for t in answer.topics
    }


def test_offset_commit_and_fetch_v10_are_advertised():
    served = served_ranges()
    assert (served[8], served[9]) == ((2, 10), (1, 10))


def test_offset_commit_v10_by_topic_id(fuzz_broker):
    """Offsets committed by id are stored under the topic (v9 by name reads them back); unknown
    and zero ids get UNKNOWN_TOPIC_ID while the known topic's commit goes through."""
    from kio.schema.offset_fetch.v9.request import (
        OffsetFetchRequest,
        OffsetFetchRequestGroup,
        OffsetFetchRequestTopics,
    )

    port = fuzz_broker.port
    topic_id = _create(port, "oc10", partitions=2)
    stranger = uuid.uuid4()
    response = _commit_v10(
        port, "g-oc10", [(stranger, [(0, 5)]), (topic_id, [(0, 7), (1, 9), (4, 1)]), (None, [(0, 1)])]
    )
    by_id = {t.topic_id: [(p.partition_index, p.error_code) for p in t.partitions] for t in response.topics}
    assert by_id == {
        stranger: [(0, ErrorCode.unknown_topic_id)],
        topic_id: [(0, ErrorCode.none), (1, ErrorCode.none), (4, ErrorCode.unknown_topic_or_partition)],
        None: [(0, ErrorCode.unknown_topic_id)],
    }
    by_name = _call(
        port,
        OffsetFetchRequest(
            groups=(
                OffsetFetchRequestGroup(
                    group_id="g-oc10", topics=(OffsetFetchRequestTopics(name="oc10", partition_indexes=(0, 1)),)
                ),
            )
        ),
    )
    (topic,) = by_name.groups[0].topics
    assert topic.name == "oc10"
    assert [(p.partition_index, p.committed_offset, p.metadata) for p in topic.partitions] == [(0, 7, "m"), (1, 9, "m")]


def test_offset_fetch_v10_by_topic_id(fuzz_broker):
    port = fuzz_broker.port
    first = _create(port, "of10-a", partitions=2)
    second = _create(port, "of10-b", partitions=1)
    _commit_v10(port, "g-of10", [(first, [(0, 3), (1, 4)]), (second, [(0, 11)])])
    stranger = uuid.uuid4()
    asked = _fetch_offsets_v10(port, "g-of10", [(first, [0, 1]), (stranger, [0, 2]), (None, [0])])
    assert asked == {
        first: [(0, 3, ErrorCode.none), (1, 4, ErrorCode.none)],
        stranger: [(0, -1, ErrorCode.unknown_topic_id), (2, -1, ErrorCode.unknown_topic_id)],
        None: [(0, -1, ErrorCode.unknown_topic_id)],
    }
    # all of the group's offsets, each topic named by its id
    assert _fetch_offsets_v10(port, "g-of10", None) == {
        first: [(0, 3, ErrorCode.none), (1, 4, ErrorCode.none)],
        second: [(0, 11, ErrorCode.none)],
    }
    fuzz_broker.assert_serving()


def test_produce_v13_acks_0_to_unknown_topic_id_closes_the_connection(fuzz_broker):
    """acks=0 gets no answer, so a failure closes the connection, as Kafka does."""
    from kio.schema.produce.v13.request import PartitionProduceData, ProduceRequest, TopicProduceData

    request = ProduceRequest(
        transactional_id=None,
        acks=0,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            TopicProduceData(
                topic_id=uuid.uuid4(), partition_data=(PartitionProduceData(index=0, records=_batch([b"x"])),)
            ),
        ),
    )
    frame = codec.encode_request(9, request)
    with socket.create_connection(("127.0.0.1", fuzz_broker.port), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        assert sock.recv(1) == b""
    fuzz_broker.assert_serving()


def test_offset_fetch_v10_leaves_out_deleted_topics(fuzz_broker):
    """A deleted topic has no id any more: v10 cannot name it, so its offsets are left out of a
    fetch of all the group's offsets, and asking for its old id is UNKNOWN_TOPIC_ID."""
    from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState

    port = fuzz_broker.port
    kept = _create(port, "of10-kept", partitions=1)
    gone = _create(port, "of10-gone", partitions=1)
    _commit_v10(port, "g-of10-del", [(kept, [(0, 1)]), (gone, [(0, 2)])])
    deleted = _call(
        port,
        DeleteTopicsRequest(topics=(DeleteTopicState(topic_id=gone),), timeout=datetime.timedelta(seconds=30)),
    )
    assert deleted.responses[0].error_code == ErrorCode.none
    assert _fetch_offsets_v10(port, "g-of10-del", None) == {kept: [(0, 1, ErrorCode.none)]}
    assert _fetch_offsets_v10(port, "g-of10-del", [(gone, [0])]) == {gone: [(0, -1, ErrorCode.unknown_topic_id)]}
