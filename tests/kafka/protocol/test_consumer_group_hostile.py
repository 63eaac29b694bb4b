"""Hostile ConsumerGroupHeartbeat / ConsumerGroupDescribe requests (KIP-848) over the wire,
as raw frames built with kio: each gets the error code a Kafka broker gives, within seconds,
and the broker keeps serving (a plain ApiVersions on a fresh connection, and the group's
honest member heartbeating on unharmed). Raw heartbeats also freeze a group mid-reconciliation
for `automq groups describe` (assigned vs target partitions)."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import socket
import struct
import time
import uuid
from typing import Any

import pytest
from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest as HeartbeatV0
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest as HeartbeatV1
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta

from automq.broker.kafka import codec

TOPIC = "hostile-848"
GROUP = "hostile-848-grp"
PARTITIONS = 3
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available, ErrorCode.not_coordinator}
TIMEOUT = i32Timedelta.parse(datetime.timedelta(seconds=30))
NO_TIMEOUT = i32Timedelta.parse(datetime.timedelta(milliseconds=-1))


class Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.correlation = 0

    def call(self, request: Any) -> Any:
        self.correlation += 1
        frame = codec.encode_request(self.correlation, request, client_id="hostile")
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        head = self._read(4)
        (size,) = struct.unpack(">i", head)
        correlation, response = codec.decode_response(self._read(size), type(request))
        assert correlation == self.correlation
        return response

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the broker closed the connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def heartbeat(
    conn: Conn,
    member_id: str,
    epoch: int,
    *,
    group: str = GROUP,
    version: int = 0,
    topics: tuple[str, ...] | None = None,
    owned: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] | None = None,
    timeout: i32Timedelta = NO_TIMEOUT,
    **fields: Any,
) -> Any:
    cls = HeartbeatV1 if version == 1 else HeartbeatV0
    tp_cls = codec.nested(cls, "TopicPartitions")
    request = codec.build(
        cls,
        group_id=GroupId(group),
        member_id=member_id,
        member_epoch=i32(epoch),
        instance_id=fields.pop("instance_id", None),
        rack_id=None,
        rebalance_timeout=timeout,
        subscribed_topic_names=None if topics is None else tuple(TopicName(t) for t in topics),
        subscribed_topic_regex=fields.pop("regex", None),
        server_assignor=fields.pop("assignor", None),
        topic_partitions=(
            None
            if owned is None
            else tuple(tp_cls(topic_id=t, partitions=tuple(i32(p) for p in ps)) for t, ps in owned)
        ),
    )
    assert not fields, fields
    return conn.call(request)


def join(conn: Conn, member_id: str = "", **fields: Any) -> Any:
    fields.setdefault("topics", (TOPIC,))
    fields.setdefault("owned", ())
    fields.setdefault("timeout", TIMEOUT)
    return heartbeat(conn, member_id, 0, **fields)


@pytest.fixture(autouse=True)
def no_broker_errors():
    """A hostile request is answered, never a traceback or an ERROR line in the broker's log."""
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
    assert not seen, [r.getMessage() for r in seen]


@pytest.fixture(scope="module")
def member(fuzz_broker):
    """An honest member of GROUP holding every partition of TOPIC: (conn, member id, epoch, topic id)."""
    service: Any = fuzz_broker.service
    asyncio.run_coroutine_threadsafe(
        service.broker.ensure_topic(TOPIC, partitions=PARTITIONS), fuzz_broker.loop
    ).result(60)
    conn = Conn(fuzz_broker.port)
    deadline = time.monotonic() + 60
    while True:
        # FindCoordinator creates __consumer_offsets; the join waits for it to be loaded
        found = conn.call(FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(GROUP,)))
        r = join(conn) if found.coordinators[0].error_code == ErrorCode.none else found.coordinators[0]
        if r.error_code not in RETRIABLE or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.error_code == ErrorCode.none, r
    [tp] = r.assignment.topic_partitions
    assert sorted(tp.partitions) == list(range(PARTITIONS))
    owned = ((tp.topic_id, tuple(tp.partitions)),)
    # confirm the assignment: the member is stable at its epoch
    ok = heartbeat(conn, r.member_id, r.member_epoch, owned=owned)
    assert ok.error_code == ErrorCode.none
    yield conn, r.member_id, r.member_epoch, tp.topic_id
    conn.close()


def still_fine(fuzz_broker, member) -> None:
    fuzz_broker.assert_serving()
    conn, member_id, epoch, _ = member
    r = heartbeat(conn, member_id, epoch)
    assert (r.error_code, r.member_epoch) == (ErrorCode.none, epoch)


CASES = {
    "empty group id": (dict(group="", epoch=0, topics=(TOPIC,), owned=(), timeout=TIMEOUT), ErrorCode.invalid_request),
    "epoch below -2": (dict(member_id="m", epoch=-3), ErrorCode.invalid_request),
    "epoch far below": (dict(member_id="m", epoch=-(2**31)), ErrorCode.invalid_request),
    "join without rebalance timeout": (dict(epoch=0, topics=(TOPIC,), owned=()), ErrorCode.invalid_request),
    "join owning partitions": (
        dict(epoch=0, topics=(TOPIC,), owned=((uuid.uuid4(), (0,)),), timeout=TIMEOUT),
        ErrorCode.invalid_request,
    ),
    "join with no subscription": (dict(epoch=0, owned=(), timeout=TIMEOUT), ErrorCode.invalid_request),
    "empty instance id": (
        dict(epoch=0, topics=(TOPIC,), owned=(), timeout=TIMEOUT, instance_id="  "),
        ErrorCode.invalid_request,
    ),
    "static leave without instance id": (dict(member_id="m", epoch=-2), ErrorCode.invalid_request),
    "unsupported assignor": (
        dict(epoch=0, topics=(TOPIC,), owned=(), timeout=TIMEOUT, assignor="sticky-ish"),
        ErrorCode.unsupported_assignor,
    ),
    "invalid regex": (
        dict(member_id="r", version=1, epoch=0, owned=(), timeout=TIMEOUT, regex="orders-[0-9"),
        ErrorCode.invalid_regular_expression,
    ),
    "v1 with empty member id": (
        dict(version=1, epoch=0, topics=(TOPIC,), owned=(), timeout=TIMEOUT),
        ErrorCode.invalid_request,
    ),
    "unknown member": (dict(member_id="nobody", epoch=1), ErrorCode.unknown_member_id),
    "unknown member leaving": (dict(member_id="nobody", epoch=-1), ErrorCode.unknown_member_id),
    "unknown group, epoch > 0": (dict(group="no-such-848-group", member_id="m", epoch=3), ErrorCode.group_id_not_found),
}


@pytest.mark.parametrize("case", list(CASES))
def test_invalid_heartbeat_gets_kafkas_error(fuzz_broker, member, case) -> None:
    fields, expected = CASES[case]
    fields = dict(fields)
    conn = Conn(fuzz_broker.port)
    try:
        r = heartbeat(conn, fields.pop("member_id", ""), fields.pop("epoch"), **fields)
    finally:
        conn.close()
    assert r.error_code == expected, (r.error_code, r.error_message)
    assert r.member_epoch == -1 or r.error_code == ErrorCode.none
    assert r.assignment is None
    still_fine(fuzz_broker, member)


def test_stale_and_future_epochs_are_fenced(fuzz_broker, member) -> None:
    _, member_id, epoch, _ = member
    other = Conn(fuzz_broker.port)
    try:
        for wrong in (epoch + 1, epoch + 1_000_000, 2**31 - 1):
            r = heartbeat(other, member_id, wrong)
            assert r.error_code == ErrorCode.fenced_member_epoch, (wrong, r)
            assert r.assignment is None
    finally:
        other.close()
    # a fenced heartbeat changes nothing: the member keeps its epoch and partitions
    still_fine(fuzz_broker, member)


def test_stale_epoch_is_fenced_once_the_member_moved_on(fuzz_broker, member) -> None:
    """A member two epochs ahead (a second member came and went): a heartbeat with its first
    epoch is neither its current nor its previous one."""
    group = "hostile-848-stale"
    a, b = Conn(fuzz_broker.port), Conn(fuzz_broker.port)
    try:
        ra = join(a, group=group)
        assert (ra.error_code, ra.member_epoch) == (ErrorCode.none, 1)
        first = ra.member_epoch
        owned = ((ra.assignment.topic_partitions[0].topic_id, tuple(range(PARTITIONS))),)

        def reconcile_to(target_epoch: int) -> None:
            nonlocal owned, epoch
            for _ in range(10):  # a revokes or takes partitions up to the group epoch
                r = heartbeat(a, ra.member_id, epoch, group=group, owned=owned)
                assert r.error_code == ErrorCode.none, r
                if r.assignment is not None:
                    owned = tuple((tp.topic_id, tuple(tp.partitions)) for tp in r.assignment.topic_partitions)
                epoch = r.member_epoch
                if epoch == target_epoch:
                    return
            raise AssertionError(f"member stuck at epoch {epoch}, wanted {target_epoch}")

        epoch = first
        rb = join(b, group=group)
        assert rb.error_code == ErrorCode.none
        reconcile_to(2)  # a gave partitions up for b
        assert heartbeat(b, rb.member_id, -1, group=group).error_code == ErrorCode.none  # b leaves: epoch 3
        reconcile_to(3)
        stale = heartbeat(b, ra.member_id, first, group=group, owned=owned)
        assert stale.error_code == ErrorCode.fenced_member_epoch, stale
        assert heartbeat(a, ra.member_id, epoch, group=group).error_code == ErrorCode.none
    finally:
        a.close()
        b.close()
    still_fine(fuzz_broker, member)


def test_owned_partitions_of_unknown_topics_and_partitions_do_not_hurt(fuzz_broker, member) -> None:
    conn, member_id, epoch, topic_id = member
    owned = ((topic_id, tuple(range(PARTITIONS))), (uuid.uuid4(), (0, 1)), (topic_id, (-1, 2**31 - 1)))
    r = heartbeat(conn, member_id, epoch, owned=owned)
    assert r.error_code == ErrorCode.none
    # the broker answers with the member's real assignment, nothing it made up
    if r.assignment is not None:
        assert {(tp.topic_id, p) for tp in r.assignment.topic_partitions for p in tp.partitions} == {
            (topic_id, p) for p in range(PARTITIONS)
        }
    ok = heartbeat(conn, member_id, epoch, owned=((topic_id, tuple(range(PARTITIONS))),))
    assert ok.error_code == ErrorCode.none
    still_fine(fuzz_broker, member)


def test_huge_owned_partitions_list_is_answered_and_harmless(fuzz_broker, member) -> None:
    """A member claiming 300 000 partitions of the real topic and 5 000 unknown topics: the
    claim is no grant, the member keeps exactly what the broker assigned it."""
    group = "hostile-848-owned"
    topic_id = member[3]
    conn = Conn(fuzz_broker.port)
    try:
        r = join(conn, group=group)
        assert r.error_code == ErrorCode.none, r
        claimed = ((topic_id, tuple(range(300_000))), *((uuid.uuid4(), (0, 1, 2)) for _ in range(5_000)))
        big = heartbeat(conn, r.member_id, r.member_epoch, group=group, owned=claimed)
        assert big.error_code == ErrorCode.none, big
        assert big.assignment is not None  # what it owns differs from its claim: the real assignment is re-sent
        assert [(tp.topic_id, sorted(tp.partitions)) for tp in big.assignment.topic_partitions] == [
            (topic_id, list(range(PARTITIONS)))
        ]
        described = conn.call(
            ConsumerGroupDescribeRequest(group_ids=(GroupId(group),), include_authorized_operations=False)
        )
        [m] = described.groups[0].members
        assert [sorted(tp.partitions) for tp in m.assignment.topic_partitions] == [list(range(PARTITIONS))]
        assert heartbeat(conn, r.member_id, big.member_epoch, group=group).error_code == ErrorCode.none
    finally:
        conn.close()
    still_fine(fuzz_broker, member)


def test_huge_subscription_list_is_answered_and_harmless(fuzz_broker, member) -> None:
    names = (*(f"no-such-topic-{i:06d}" for i in range(50_000)), TOPIC)
    conn = Conn(fuzz_broker.port)
    try:
        r = join(conn, topics=names, group="hostile-848-huge", member_id="")
        assert r.error_code == ErrorCode.none, r
        # the one real topic is assigned; the 50 000 missing ones are just not there
        assert [(tp.topic_id, sorted(tp.partitions)) for tp in r.assignment.topic_partitions] == [
            (member[3], list(range(PARTITIONS)))
        ]
        left = heartbeat(conn, r.member_id, -1, group="hostile-848-huge")
        assert left.error_code == ErrorCode.none
    finally:
        conn.close()
    still_fine(fuzz_broker, member)


def test_describe_of_hostile_group_ids(fuzz_broker, member) -> None:
    conn = Conn(fuzz_broker.port)
    try:
        many = tuple(GroupId(f"g-{i}") for i in range(2_000))
        r = conn.call(
            ConsumerGroupDescribeRequest(
                group_ids=(GroupId(""), GroupId(GROUP), *many), include_authorized_operations=True
            )
        )
    finally:
        conn.close()
    by_id: dict[str, Any] = {g.group_id: g for g in r.groups}
    assert len(r.groups) == 2 + len(many)
    assert by_id[""].error_code == ErrorCode.invalid_group_id
    assert by_id[GROUP].error_code == ErrorCode.none and len(by_id[GROUP].members) == 1
    assert {g.error_code for g in r.groups if g.group_id.startswith("g-")} == {ErrorCode.group_id_not_found}
    still_fine(fuzz_broker, member)


RECONCILING_GROUP = "reconciling-848"


def test_describe_shows_assigned_and_target_while_reconciling(fuzz_broker, member) -> None:
    """`automq groups describe` of a group caught mid-reconciliation, made deterministic with
    raw heartbeats: A holds every partition, B joins and A has not heartbeated since, so the
    group is Reconciling, B's target is non-empty while it holds nothing, and A still holds
    what its target no longer gives it."""
    from typer.testing import CliRunner

    from automq.broker.cli import app

    a, b = Conn(fuzz_broker.port), Conn(fuzz_broker.port)
    try:
        ra = join(a, group=RECONCILING_GROUP)
        owned = ((member[3], tuple(range(PARTITIONS))),)
        assert (
            heartbeat(a, ra.member_id, ra.member_epoch, group=RECONCILING_GROUP, owned=owned).error_code
            == ErrorCode.none
        )
        rb = join(b, group=RECONCILING_GROUP)
        assert rb.error_code == ErrorCode.none and rb.member_epoch == 2
        result = CliRunner().invoke(
            app,
            [
                "groups",
                "describe",
                RECONCILING_GROUP,
                "--bootstrap",
                f"127.0.0.1:{fuzz_broker.port}",
                "--output",
                "json",
            ],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        detail = json.loads(result.output)
        assert detail["type"] == "consumer" and detail["state"] == "Reconciling"
        assert (detail["group_epoch"], detail["assignment_epoch"]) == (2, 2)
        members = {m["member_id"]: m for m in detail["members"]}
        ma, mb = members[ra.member_id], members[rb.member_id]
        # A is still at epoch 1 holding all 3; the target splits them
        assert ma["member_epoch"] == 1 and [p for _, p in ma["assignment"]] == list(range(PARTITIONS))
        assert mb["member_epoch"] == 2 and mb["assignment"] == []
        assert mb["target"] and ma["target"]
        assert {p for _, p in ma["target"]} | {p for _, p in mb["target"]} == set(range(PARTITIONS))
        assert not {p for _, p in ma["target"]} & {p for _, p in mb["target"]}
        # lag rows name the current owner (A), not the target one
        assert {o["partition"]: o["owner"] for o in detail["offsets"]} == dict.fromkeys(range(PARTITIONS), ra.member_id)
        table = CliRunner().invoke(
            app,
            ["groups", "describe", RECONCILING_GROUP, "--bootstrap", f"127.0.0.1:{fuzz_broker.port}"],
            catch_exceptions=False,
        )
        assert table.exit_code == 0 and "Reconciling" in table.output
    finally:
        a.close()
        b.close()
