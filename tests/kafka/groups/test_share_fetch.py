"""ShareFetch / ShareAcknowledge on the partition leader (KIP-932), through the registered
handlers of real brokers (real controller, storage engine, file:// object store): share
sessions, acquisition, acknowledgements made durable, redelivery, delivery-count limit,
state recovered by the next leader, and Kafka's error codes for hostile requests."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import records
from automq.broker.kafka.groups.share_settings import ShareGroupSettings
from automq.broker.kafka.share.partition_state import ACCEPT, REJECT, RELEASE

SHARE_FETCH, SHARE_ACK = 78, 79
GROUP = "sg"


async def _produce(node, topic: str, partition: int, count: int, per_batch: int = 1) -> None:
    p = await node.broker.partitions.get_when_open(topic, partition, 10)
    for start in range(0, count, per_batch):
        n = min(per_batch, count - start)
        batch = bytearray(
            records.build_batch(
                0,
                [records.encode_record(0, i, None, f"v{start + i}".encode()) for i in range(n)],
                last_offset_delta=n - 1,
                base_timestamp=1,
                max_timestamp=1,
            )
        )
        await p.append_batch(batch, records.parse_header(batch))


def _topic_id(node, topic: str) -> uuid.UUID:
    return uuid.UUID(node.broker.partitions.topic(topic).topic_id)


async def _fetch(
    node,
    member: str,
    epoch: int,
    parts: dict[int, list[tuple[int, int, list[int]]]] | None = None,
    *,
    topic: str = "q",
    max_records: int = 500,
    max_wait_ms: int = 0,
    group: str = GROUP,
    topic_id: uuid.UUID | None = None,
    forgotten: tuple = (),
    max_bytes: int = 1 << 20,
) -> Any:
    tid = topic_id or _topic_id(node, topic)
    topics = ()
    if parts is not None:
        topics = (
            {
                "topic_id": tid,
                "partitions": tuple(
                    {
                        "partition_index": index,
                        "acknowledgement_batches": tuple(
                            {"first_offset": f, "last_offset": la, "acknowledge_types": tuple(t)} for f, la, t in acks
                        ),
                    }
                    for index, acks in parts.items()
                ),
            },
        )
    from datetime import timedelta

    from automq.broker.kafka import codec

    req_cls = codec.request_class(SHARE_FETCH, 1)

    def build(d: dict) -> Any:
        topic_cls = codec.nested(req_cls, "FetchTopic")
        part_cls = codec.nested(req_cls, "FetchPartition")
        batch_cls = codec.nested(req_cls, "AcknowledgementBatch")
        return topic_cls(
            topic_id=d["topic_id"],
            partitions=tuple(
                part_cls(
                    partition_index=p["partition_index"],
                    acknowledgement_batches=tuple(batch_cls(**b) for b in p["acknowledgement_batches"]),
                )
                for p in d["partitions"]
            ),
        )

    return await node.call(
        SHARE_FETCH,
        1,
        group_id=group,
        member_id=member,
        share_session_epoch=epoch,
        max_wait=timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        max_records=max_records,
        batch_size=500,
        topics=tuple(build(t) for t in topics),
        forgotten_topics_data=forgotten,
    )


async def _ack(node, member: str, epoch: int, index: int, acks: list[tuple[int, int, list[int]]], topic="q") -> Any:
    from automq.broker.kafka import codec

    req_cls = codec.request_class(SHARE_ACK, 1)
    batch_cls = codec.nested(req_cls, "AcknowledgementBatch")
    part_cls = codec.nested(req_cls, "AcknowledgePartition")
    topic_cls = codec.nested(req_cls, "AcknowledgeTopic")
    return await node.call(
        SHARE_ACK,
        1,
        group_id=GROUP,
        member_id=member,
        share_session_epoch=epoch,
        topics=(
            topic_cls(
                topic_id=_topic_id(node, topic),
                partitions=(
                    part_cls(
                        partition_index=index,
                        acknowledgement_batches=tuple(
                            batch_cls(first_offset=f, last_offset=la, acknowledge_types=tuple(t)) for f, la, t in acks
                        ),
                    ),
                ),
            ),
        ),
    )


def _acquired(resp) -> dict[int, list[tuple[int, int, int]]]:
    out: dict[int, list[tuple[int, int, int]]] = {}
    for t in resp.responses:
        for p in t.partitions:
            assert p.error_code == ErrorCode.none, p
            if p.acquired_records:
                out[p.partition_index] = [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
    return out


def _ack_errors(resp) -> dict[int, ErrorCode]:
    return {p.partition_index: p.acknowledge_error_code for t in resp.responses for p in t.partitions}


def _settings(**kw: Any):
    return lambda _broker, _group: ShareGroupSettings(auto_offset_reset="earliest", **kw)


async def _node(cluster, partitions: int = 1, **settings: Any):
    node = await cluster.start_node(1)
    node.broker.share_partitions._settings = _settings(**settings)
    await node.broker.ensure_topic("q", partitions=partitions)
    return node


async def test_members_share_a_partition_and_acknowledgements_are_durable(cluster) -> None:
    node = await _node(cluster)
    await _produce(node, "q", 0, 10, per_batch=5)
    r1 = await _fetch(node, "m1", 0, {0: []}, max_records=3)
    assert r1.error_code == ErrorCode.none
    # batch-optimized (Kafka's default): max_records is exceeded to the end of its batch
    assert _acquired(r1) == {0: [(0, 4, 1)]}
    assert r1.acquisition_lock_timeout.total_seconds() == 30
    r2 = await _fetch(node, "m2", 0, {0: []})
    assert _acquired(r2) == {0: [(5, 9, 1)]}  # what m1 holds is not handed out twice
    r3 = await _fetch(node, "m3", 0, {0: []})
    assert _acquired(r3) == {}
    # m1 accepts 0..2 and releases 3..4 on its next fetch, which hands 3..4 out again
    r1 = await _fetch(node, "m1", 1, {0: [(0, 4, [ACCEPT, ACCEPT, ACCEPT, RELEASE, RELEASE])]})
    assert _ack_errors(r1) == {0: ErrorCode.none}
    assert _acquired(r1) == {0: [(3, 4, 2)]}
    share = await node.broker.share_partitions.get(GROUP, "q", 0)
    assert share.state.start_offset == 3
    # what a new leader would load: 0..2 done (below the start), the rest redeliverable
    stream_id = node.broker.partitions.get("q", 0).stream.stream_id
    snapshot, _etag = await node.broker.share_partitions.store.load(GROUP, stream_id)
    assert snapshot.start_offset == 3 and snapshot.leader_epoch >= 0
    r = await _ack(node, "m2", 1, 0, [(5, 9, [ACCEPT])])
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.none]
    r = await _ack(node, "m1", 2, 0, [(3, 4, [REJECT])])
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.none]
    assert (await node.broker.share_partitions.summary(GROUP, "q", 0))[0] == 10


async def test_max_bytes_zero_acquires_nothing(cluster) -> None:
    """Kafka answers a ShareFetch with MaxBytes 0 without records (librdkafka's
    fetch.max.bytes=0, test 0180): nothing is handed out, so nothing is locked either."""
    node = await _node(cluster)
    await _produce(node, "q", 0, 4)
    empty = await _fetch(node, "m1", 0, {0: []}, max_bytes=0, max_wait_ms=300)
    assert empty.error_code == ErrorCode.none
    assert _acquired(empty) == {}
    assert _acquired(await _fetch(node, "m2", 0, {0: []})) == {0: [(0, 3, 1)]}


async def test_hostile_requests_get_kafkas_codes(cluster) -> None:
    node = await _node(cluster)
    await _produce(node, "q", 0, 4)
    # acknowledgements on the session-opening fetch
    r = await _fetch(node, "m1", 0, {0: [(0, 0, [ACCEPT])]})
    assert r.error_code == ErrorCode.invalid_request
    # no session yet
    assert (await _fetch(node, "m1", 1, {0: []})).error_code == ErrorCode.share_session_not_found
    assert (await _ack(node, "m1", 1, 0, [(0, 0, [ACCEPT])])).error_code == ErrorCode.share_session_not_found
    assert _acquired(await _fetch(node, "m1", 0, {0: []})) == {0: [(0, 3, 1)]}
    # wrong epochs
    assert (await _fetch(node, "m1", 5, {0: []})).error_code == ErrorCode.invalid_share_session_epoch
    assert (await _ack(node, "m1", 0, 0, [(0, 0, [ACCEPT])])).error_code == ErrorCode.invalid_share_session_epoch
    # records the member does not hold, an oversized batch, overlapping batches, bad types
    r = await _fetch(node, "m1", 1, {0: [(0, (1 << 62), [ACCEPT])]})
    assert _ack_errors(r) == {0: ErrorCode.invalid_record_state}
    r = await _fetch(node, "m1", 2, {0: [(0, 2, [ACCEPT]), (2, 3, [ACCEPT])]})
    assert _ack_errors(r) == {0: ErrorCode.invalid_request}
    r = await _fetch(node, "m1", 3, {0: [(0, 1, [ACCEPT, 7])]})
    assert _ack_errors(r) == {0: ErrorCode.invalid_request}
    r = await _ack(node, "m2", 0, 0, [(0, 0, [ACCEPT])])
    assert r.error_code == ErrorCode.invalid_share_session_epoch
    # another member's records
    assert _acquired(await _fetch(node, "m2", 0, {0: []})) == {}
    r = await _ack(node, "m2", 1, 0, [(0, 0, [ACCEPT])])
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.invalid_record_state]
    # unknown topic id, unknown partition
    r = await _fetch(node, "m3", 0, {0: []}, topic_id=uuid.uuid4())
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.unknown_topic_id]
    r = await _fetch(node, "m4", 0, {7: [], -1: [], 1 << 30: []})
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.unknown_topic_or_partition] * 3
    assert node.broker.share_sessions.get(GROUP, "m4").partitions == {}  # never kept in the session
    # no member id, no group id
    assert (await _fetch(node, "", 0, {0: []})).error_code == ErrorCode.invalid_request
    assert (await _fetch(node, "m5", 0, {0: []}, group="")).error_code == ErrorCode.invalid_group_id
    # after all that the records are still m1's, and m1 can accept them
    r = await _fetch(node, "m1", 4, {0: [(0, 3, [ACCEPT])]})
    assert _ack_errors(r) == {0: ErrorCode.none}


async def test_closing_a_session_releases_and_the_delivery_limit_archives_a_poison_record(cluster) -> None:
    node = await _node(cluster, delivery_count_limit=3)
    await _produce(node, "q", 0, 2)
    assert _acquired(await _fetch(node, "a", 0, {0: []}, max_records=1)) == {0: [(0, 0, 1)]}
    await _fetch(node, "a", -1)  # closes the session: offset 0 goes back
    assert _acquired(await _fetch(node, "b", 0, {0: []}, max_records=1)) == {0: [(0, 0, 2)]}
    r = await _fetch(node, "b", 1, {0: [(0, 0, [RELEASE])]}, max_records=1)
    assert _acquired(r) == {0: [(0, 0, 3)]}
    r = await _fetch(node, "b", 2, {0: [(0, 0, [RELEASE])]}, max_records=1)
    # third delivery released: archived, never delivered again; the next record comes instead
    assert _acquired(r) == {0: [(1, 1, 1)]}
    share = await node.broker.share_partitions.get(GROUP, "q", 0)
    assert share.state.start_offset == 1
    sample = node.broker.registry.get_sample_value
    assert sample("kafka_share_records_delivered_total", {"delivery": "redelivery"}) == 2
    assert sample("kafka_share_records_delivered_total", {"delivery": "first"}) == 2
    assert sample("kafka_share_records_acknowledged_total", {"type": "release"}) == 2
    assert sample("kafka_share_records_released_on_close_total") == 1
    assert sample("kafka_share_state_write_seconds_count") >= 3


async def test_an_expired_lock_makes_records_available_again(cluster) -> None:
    node = await _node(cluster, record_lock_duration_ms=200)
    await _produce(node, "q", 0, 3)
    r = await _fetch(node, "dead", 0, {0: []})
    assert _acquired(r) == {0: [(0, 2, 1)]}
    assert r.acquisition_lock_timeout.total_seconds() == 0.2
    # "dead" never acknowledges; a long poll of another member is woken by the expiry
    r = await _fetch(node, "alive", 0, {0: []}, max_wait_ms=30_000)
    assert _acquired(r) == {0: [(0, 2, 2)]}
    assert node.broker.registry.get_sample_value("kafka_share_records_lock_expired_total") == 3
    r = await _ack(node, "dead", 1, 0, [(0, 2, [ACCEPT])])  # too late
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.invalid_record_state]


async def test_a_new_leader_redelivers_locked_records_but_nothing_acknowledged(cluster) -> None:
    n1 = await _node(cluster, partitions=2)
    n2 = await cluster.start_node(2)
    n2.broker.share_partitions._settings = _settings()
    await _produce(n1, "q", 0, 6)
    assert _acquired(await _fetch(n1, "m", 0, {0: []})) == {0: [(0, 5, 1)]}
    assert _ack_errors(await _fetch(n1, "m", 1, {0: [(0, 2, [ACCEPT])]})) == {0: ErrorCode.none}
    old = await n1.broker.share_partitions.get(GROUP, "q", 0)
    # move q-0 to node 2: the old leader writes the state once more, the new one loads it
    await n1.broker.cluster.reassign_partition("q", 0, 2)
    for _ in range(400):
        if any(p.topic == "q" and p.partition == 0 for p in n2.broker.partitions.led()):
            break
        await asyncio.sleep(0.05)
    got = _acquired(await _fetch(n2, "m2", 0, {0: []}))
    assert got == {0: [(3, 5, 2)]}  # 0..2 acknowledged on the old leader are not redelivered
    # the deposed leader's state can no longer be written
    assert old.closed or old.fenced
    # the old leader answers NOT_LEADER_OR_FOLLOWER with the new leader's endpoint
    r = await _fetch(n1, "m", 2, {0: [(3, 5, [ACCEPT])]})
    part = r.responses[0].partitions[0]
    assert part.acknowledge_error_code == ErrorCode.not_leader_or_follower
    assert part.current_leader.leader_id == 2


async def test_a_crashed_leaders_successor_loads_the_last_write(cluster) -> None:
    """A crash loses the locks (not written) but not the acknowledgements (written before
    they were answered); a deposed writer is fenced by the successor's claim."""
    node = await _node(cluster)
    await _produce(node, "q", 0, 4)
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 3, 1)]}
    assert _ack_errors(await _fetch(node, "m", 1, {0: [(1, 1, [ACCEPT])]})) == {0: ErrorCode.none}
    manager = node.broker.share_partitions
    zombie = manager._shares.pop((GROUP, "q", 0))  # as if the broker forgot everything
    assert _acquired(await _fetch(node, "n", 0, {0: []})) == {0: [(0, 0, 2), (2, 3, 2)]}
    zombie.changed()
    try:
        await zombie.persist()
        raise AssertionError("a deposed writer overwrote the state")
    except Exception as exc:
        assert type(exc).__name__ == "ShareStateFenced"


async def test_read_committed_share_groups_never_see_aborted_records_or_markers(cluster) -> None:
    node = await _node(cluster, isolation_level="read_committed")
    p = await node.broker.partitions.get_when_open("q", 0, 10)

    async def txn_batch(pid: int, values: list[bytes]) -> None:
        batch = bytearray(
            records.build_batch(
                0,
                [records.encode_record(0, i, None, v) for i, v in enumerate(values)],
                last_offset_delta=len(values) - 1,
                base_timestamp=1,
                max_timestamp=1,
                attributes=records.TRANSACTIONAL_BIT,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=0,
            )
        )
        await p.append_batch(batch, records.parse_header(batch))

    await txn_batch(1000, [b"aborted-1", b"aborted-2"])  # offsets 0-1
    await txn_batch(1001, [b"committed"])  # offset 2
    await p.append_marker(1000, 0, False, 0)  # 3: ABORT
    # an open transaction holds back everything from its first offset
    await txn_batch(1002, [b"open"])  # 4
    await p.append_marker(1001, 0, True, 0)  # 5: COMMIT
    await _produce(node, "q", 0, 1)  # 6
    assert p.last_stable_offset == 4
    r = await _fetch(node, "m", 0, {0: []})
    assert _acquired(r) == {0: [(2, 2, 1)]}
    await p.append_marker(1002, 0, True, 0)  # 7: COMMIT of the open one
    r = await _fetch(node, "m", 1, {0: [(2, 2, [ACCEPT])]})
    assert _acquired(r) == {0: [(4, 4, 1), (6, 6, 1)]}
    share = await node.broker.share_partitions.get(GROUP, "q", 0)
    assert share.state.start_offset == 4  # 0-3 done: aborted and the marker archived, 2 accepted


async def test_v2_renew_extends_locks_without_fetching(cluster) -> None:
    from datetime import timedelta

    from automq.broker.kafka import codec
    from automq.broker.kafka.share.partition_state import RENEW

    node = await _node(cluster, record_lock_duration_ms=60_000)
    await _produce(node, "q", 0, 4)
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 3, 1)]}
    share = await node.broker.share_partitions.get(GROUP, "q", 0)
    before = share.state.next_deadline()
    await asyncio.sleep(0.01)
    req_cls = codec.request_class(SHARE_FETCH, 2)
    batch_cls = codec.nested(req_cls, "AcknowledgementBatch")
    r = await node.call(
        SHARE_FETCH,
        2,
        group_id=GROUP,
        member_id="m",
        share_session_epoch=1,
        max_wait=timedelta(0),
        min_bytes=1,
        max_bytes=1 << 20,
        max_records=500,
        batch_size=500,
        is_renew_ack=True,
        topics=(
            codec.nested(req_cls, "FetchTopic")(
                topic_id=_topic_id(node, "q"),
                partitions=(
                    codec.nested(req_cls, "FetchPartition")(
                        partition_index=0,
                        acknowledgement_batches=(batch_cls(first_offset=0, last_offset=3, acknowledge_types=(RENEW,)),),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    assert _ack_errors(r) == {0: ErrorCode.none} and _acquired(r) == {}
    assert share.state.next_deadline() > before  # still m's, locked for longer


async def test_a_closed_connection_ends_its_share_session_and_releases_the_records(cluster) -> None:
    from automq.broker.kafka import codec, handlers
    from automq.broker.kafka.context import RequestContext

    node = await _node(cluster)
    await _produce(node, "q", 0, 3)
    connection: dict = {}
    original = node.call

    async def call_on_connection(api_key: int, version: int, **fields: Any) -> Any:
        request = codec.build(codec.request_class(api_key, version), **fields)
        ctx = RequestContext(
            api_key, version, 1, "t", "127.0.0.1:1", codec.response_class(api_key, version), node.broker
        )
        ctx.on_close = connection
        registration = handlers.lookup(api_key)
        assert registration is not None
        return await registration.handler(request, ctx)

    node.call = call_on_connection
    try:
        assert _acquired(await _fetch(node, "dies", 0, {0: []})) == {0: [(0, 2, 1)]}
    finally:
        node.call = original
    assert _acquired(await _fetch(node, "other", 0, {0: []})) == {}
    for callback in list(connection.values()):  # what the server does when the socket closes
        callback()
    assert node.broker.share_sessions.get(GROUP, "dies") is None
    assert _acquired(await _fetch(node, "other", 1, {0: []})) == {0: [(0, 2, 2)]}


async def test_idle_share_partitions_are_unloaded_and_reload_from_their_state(cluster) -> None:
    import time as _time

    node = await _node(cluster)
    await _produce(node, "q", 0, 4)
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 3, 1)]}
    manager = node.broker.share_partitions
    assert manager.unload_idle(_time.monotonic() + 1) == 0  # records are held: stays
    assert _ack_errors(await _fetch(node, "m", 1, {0: [(0, 1, [ACCEPT]), (2, 3, [RELEASE])]})) == {0: ErrorCode.none}
    await _fetch(node, "m", -1)  # closes the session: nothing held any more
    await manager.shares()[0].persist()  # the release is written in the background
    assert manager.unload_idle(_time.monotonic() + 1) == 1
    assert manager.shares() == []
    # the next fetch loads the written state: 0-1 done, 2-3 delivered twice already (released,
    # taken again by the same fetch, released by the session's close)
    assert _acquired(await _fetch(node, "n", 0, {0: []})) == {0: [(2, 3, 3)]}


async def test_initialize_fixes_the_start_before_the_first_fetch(cluster) -> None:
    node = await cluster.start_node(1)  # share.auto.offset.reset=latest (the default)
    await node.broker.ensure_topic("q", partitions=1)
    await _produce(node, "q", 0, 2)
    assert await node.broker.share_partitions.initialize(GROUP, "q", 0) == 2
    await _produce(node, "q", 0, 3)  # after the assignment, before any ShareFetch
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(2, 4, 1)]}


async def test_a_long_poll_behind_an_open_transaction_waits_without_blocking_the_broker(cluster) -> None:
    """read_committed, an open transaction at the log's end: nothing is acquirable below the
    last stable offset although the high watermark is above it. The long poll must wait on
    the partition, not spin (a spin would starve every other task of the broker)."""
    node = await _node(cluster, isolation_level="read_committed")
    p = await node.broker.partitions.get_when_open("q", 0, 10)
    batch = bytearray(
        records.build_batch(
            0,
            [records.encode_record(0, 0, None, b"open")],
            last_offset_delta=0,
            base_timestamp=1,
            max_timestamp=1,
            attributes=records.TRANSACTIONAL_BIT,
            producer_id=2000,
            producer_epoch=0,
            base_sequence=0,
        )
    )
    await p.append_batch(batch, records.parse_header(batch))
    assert (p.last_stable_offset, p.high_watermark) == (0, 1)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {}  # loads the share-partition
    task = asyncio.get_running_loop().create_task(ticker())
    try:
        await asyncio.sleep(0.05)
        before = ticks
        r = await _fetch(node, "m", 1, {0: []}, max_wait_ms=300)
        during = ticks - before
    finally:
        task.cancel()
    assert _acquired(r) == {}
    assert during > 0  # other tasks ran during the long poll


async def test_share_fetch_needs_read_on_the_group_and_the_topic(cluster) -> None:
    from automq.broker.controller import acls as model

    node = await cluster.start_node(1, authorizer_class_name="standard")
    node.broker.share_partitions._settings = _settings()
    await node.broker.ensure_topic("q", partitions=1)
    await _produce(node, "q", 0, 2)
    # no ACL at all: the group is refused before anything else
    assert (await _fetch(node, "m", 0, {0: []})).error_code == ErrorCode.group_authorization_failed

    async def grant(rtype: model.ResourceType, name: str) -> None:
        b = model.AclBinding(
            int(rtype),
            name,
            int(model.PatternType.LITERAL),
            "User:ANONYMOUS",
            "*",
            int(model.AclOperation.READ),
            int(model.PermissionType.ALLOW),
        )
        assert await node.client.create_acls([b]) == [(None, None)]
        for _ in range(200):
            if any(a.key() == b.key() for a in node.broker.metadata.acls):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the ACL never reached the broker")

    await grant(model.ResourceType.GROUP, GROUP)
    r = await _fetch(node, "m", 0, {0: []})
    assert r.error_code == ErrorCode.none
    assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.topic_authorization_failed]
    await grant(model.ResourceType.TOPIC, "q")
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 1, 1)]}


async def test_one_bad_acknowledgement_batch_refuses_the_partitions_others(cluster) -> None:
    node = await _node(cluster)
    await _produce(node, "q", 0, 6)
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 5, 1)]}
    r = await _fetch(node, "m", 1, {0: [(0, 1, [ACCEPT]), (2, 3, [REJECT]), (4, 9, [ACCEPT])]})
    assert _ack_errors(r) == {0: ErrorCode.invalid_record_state}  # 6..9 were never delivered
    share = await node.broker.share_partitions.get(GROUP, "q", 0)
    assert share.state.start_offset == 0 and share.state.count(1) == 6  # all six still acquired by m
    assert _ack_errors(await _fetch(node, "m", 2, {0: [(0, 5, [ACCEPT])]})) == {0: ErrorCode.none}


async def test_deleting_a_topic_deletes_the_share_state_loaded_for_it(cluster) -> None:
    node = await _node(cluster)
    await _produce(node, "q", 0, 2)
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 1, 1)]}
    store = node.broker.share_partitions.store
    stream_id = node.broker.partitions.get("q", 0).stream.stream_id
    assert await store.load(GROUP, stream_id) is not None
    await node.client.delete_topic("q")
    for _ in range(200):
        if node.broker.share_partitions.shares() == [] and await store.load(GROUP, stream_id) is None:
            break
        await asyncio.sleep(0.05)
    assert node.broker.share_partitions.shares() == []
    assert await store.load(GROUP, stream_id) is None


async def test_a_topic_recreated_under_its_name_is_not_fetched_for_the_old_ones_session(cluster) -> None:
    """A session holds the partition under the topic id the client added. Once that topic is
    deleted and another created under its name, the next fetch answers the old id
    UNKNOWN_TOPIC_ID once and drops it from the session; the new topic's records go to no one
    who did not add its id (librdkafka got them unasked, dropped them, and their locks expired
    three times: confluent-kafka-python's test_topic_recreate_resumes_with_fresh_delivery)."""
    node = await _node(cluster)
    await _produce(node, "q", 0, 2)
    old_id = _topic_id(node, "q")
    assert _acquired(await _fetch(node, "m", 0, {0: []})) == {0: [(0, 1, 1)]}
    await node.client.delete_topic("q")
    for _ in range(200):
        if node.broker.partitions.topic("q") is None:
            break
        await asyncio.sleep(0.05)
    await node.broker.ensure_topic("q", partitions=1)
    new_id = _topic_id(node, "q")
    assert new_id != old_id
    await _produce(node, "q", 0, 3)
    resp = await _fetch(node, "m", 1, topic_id=old_id)  # incremental: nothing added or acknowledged
    answered = {(t.topic_id, p.partition_index): p for t in resp.responses for p in t.partitions}
    assert set(answered) == {(old_id, 0)}
    assert answered[(old_id, 0)].error_code == ErrorCode.unknown_topic_id
    assert not answered[(old_id, 0)].acquired_records
    resp = await _fetch(node, "m", 2, topic_id=old_id)
    assert [p for t in resp.responses for p in t.partitions] == []  # gone from the session
    # a client that adds the new id gets the new topic's records, first delivery
    assert _acquired(await _fetch(node, "m", 3, {0: []}, topic_id=new_id)) == {0: [(0, 2, 1)]}


async def test_the_share_session_cache_takes_group_share_max_share_sessions(cluster) -> None:
    """Kafka's group.share.max.share.sessions bounds the share sessions a broker keeps."""
    node = await cluster.start_node(1, group_share_max_share_sessions=1)
    await node.broker.ensure_topic("q", partitions=1)
    assert node.broker.share_sessions.max_sessions == 1
    assert (await _fetch(node, "m1", 0, {0: []})).error_code == ErrorCode.none
    assert (await _fetch(node, "m2", 0, {0: []})).error_code == ErrorCode.share_session_limit_reached
