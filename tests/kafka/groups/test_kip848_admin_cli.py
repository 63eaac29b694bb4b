"""`automq groups list|describe` show KIP-848 groups next to classic ones: a real broker, two
librdkafka `group.protocol=consumer` members and a classic group on the same topic, the CLI
run as a user types it (table and JSON)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from typer.testing import CliRunner

TOPIC = "k848-cli"
PARTITIONS = 4
GROUP = "k848-cli-grp"
CLASSIC = "classic-cli-grp"
RECORDS = 40
FAST = {"group_consumer_heartbeat_interval_ms": 300, "group_consumer_session_timeout_ms": 20_000}


def produce(bootstrap: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(RECORDS):
        p.produce(TOPIC, value=str(i).encode(), partition=i % PARTITIONS)
    assert p.flush(30) == 0


class Member(threading.Thread):
    """Consumes and commits every record at or below `upto` per partition; keeps polling
    (heartbeats, rebalance callbacks) until stopped."""

    def __init__(self, bootstrap: str, name: str, commit_upto: int) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap = bootstrap
        self.commit_upto = commit_upto
        self.assigned: frozenset[int] = frozenset()
        self.seen = 0
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        try:
            c = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": GROUP,
                    "group.protocol": "consumer",
                    "client.id": self.name,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )

            def on_assign(consumer, partitions):
                self.assigned = self.assigned | {p.partition for p in partitions}

            def on_revoke(consumer, partitions):
                self.assigned = self.assigned - {p.partition for p in partitions}

            c.subscribe([TOPIC], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
            while not self.stop_flag.is_set():
                msg = c.poll(0.1)
                if msg is None or msg.error():
                    continue
                self.seen += 1
                if msg.offset() < self.commit_upto:
                    c.commit(offsets=[TopicPartition(TOPIC, msg.partition(), msg.offset() + 1)], asynchronous=False)
            c.close()
        except BaseException as exc:
            self.error = exc


def classic_commit(bootstrap: str) -> None:
    """An empty classic group with offset 2 committed on every partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": CLASSIC, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(TOPIC, p, 2) for p in range(PARTITIONS)], asynchronous=False)
    finally:
        c.close()


def cli(*args: str) -> tuple[int, str]:
    from automq.broker.cli import app

    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


async def wait_for(condition, timeout: float = 90.0, state=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in time: {state()}")
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_groups_cli_shows_consumer_protocol_groups(real_cluster) -> None:
    service = await real_cluster.start_broker(1, **FAST)
    await service.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = service.bootstrap
    await asyncio.to_thread(produce, bootstrap)
    await asyncio.to_thread(classic_commit, bootstrap)

    # each member commits up to offset 7 of the partitions it reads: lag 3 per partition
    members = [Member(bootstrap, f"cli-{n}", commit_upto=7) for n in "ab"]
    for m in members:
        m.start()
    manager = service.broker.groups.manager
    try:

        def settled() -> bool:
            parts = [m.assigned for m in members]
            data = manager.groups[GROUP].consumer if GROUP in manager.groups else None
            return (
                all(parts)
                and frozenset().union(*parts) == frozenset(range(PARTITIONS))
                and sum(map(len, parts)) == PARTITIONS
                and sum(m.seen for m in members) >= RECORDS
                and data is not None
                and data.state_name() == "Stable"
            )

        await wait_for(
            lambda: any(m.error for m in members) or settled(),
            state=lambda: ([(m.name, sorted(m.assigned), m.seen) for m in members], manager.groups.get(GROUP)),
        )
        assert [m.error for m in members] == [None, None]
        b = ("--bootstrap", bootstrap)

        code, out = await asyncio.to_thread(cli, "groups", "list", *b, "--output", "json")
        assert code == 0, out
        listed = {g["group_id"]: g for g in json.loads(out)}
        assert listed[GROUP]["type"] == "consumer" and listed[GROUP]["state"] == "Stable"
        assert listed[CLASSIC]["type"] == "classic" and listed[CLASSIC]["state"] == "Empty"
        code, table = await asyncio.to_thread(cli, "groups", "list", *b)
        assert code == 0 and "type" in table and "consumer" in table and "classic" in table
        for kind, wanted, other in (("consumer", GROUP, CLASSIC), ("classic", CLASSIC, GROUP)):
            code, out = await asyncio.to_thread(cli, "groups", "list", *b, "--type", kind, "--output", "json")
            assert code == 0, out
            ids = {g["group_id"] for g in json.loads(out)}
            assert wanted in ids and other not in ids
        code, out = await asyncio.to_thread(cli, "groups", "list", *b, "--type", "streams")
        assert code == 2 and "--type must be classic, consumer or share" in out

        code, out = await asyncio.to_thread(cli, "groups", "describe", GROUP, *b, "--output", "json")
        assert code == 0, out
        detail = json.loads(out)
        data = manager.groups[GROUP].consumer
        assert detail["type"] == "consumer" and detail["state"] == "Stable"
        assert (detail["group_epoch"], detail["assignment_epoch"]) == (data.group_epoch, data.assignment_epoch)
        assert detail["assignor"] == "uniform"
        assert {m["client_id"] for m in detail["members"]} == {"cli-a", "cli-b"}
        by_client = {m["client_id"]: m for m in detail["members"]}
        for m in members:
            described = by_client[m.name]
            # what the broker says each member holds is what librdkafka says it was given
            assert {p for _, p in described["assignment"]} == set(m.assigned)
            assert described["target"] == described["assignment"]  # stable: nothing left to move
            assert described["member_epoch"] == data.assignment_epoch
        owners = {o["partition"]: o["owner"] for o in detail["offsets"] if o["topic"] == TOPIC}
        ids = {m["member_id"]: m["client_id"] for m in detail["members"]}
        assert {p: ids[owner] for p, owner in owners.items()} == {p: m.name for m in members for p in m.assigned}
        lags = {o["partition"]: (o["committed"], o["end_offset"], o["lag"]) for o in detail["offsets"]}
        assert lags == dict.fromkeys(range(PARTITIONS), (7, RECORDS // PARTITIONS, 3))
        assert detail["total_lag"] == 3 * PARTITIONS

        code, table = await asyncio.to_thread(cli, "groups", "describe", GROUP, *b)
        assert code == 0, table
        assert "consumer protocol" in table and "Stable" in table and f"group epoch {data.group_epoch}" in table
        assert "target" in table and f"total lag {3 * PARTITIONS}" in table

        # a classic group is still described through DescribeGroups, with its own lag
        code, out = await asyncio.to_thread(cli, "groups", "describe", CLASSIC, *b, "--output", "json")
        assert code == 0, out
        classic = json.loads(out)
        assert classic["type"] == "classic" and classic["group_epoch"] is None and classic["members"] == []
        assert classic["total_lag"] == (RECORDS // PARTITIONS - 2) * PARTITIONS
    finally:
        for m in members:
            m.stop_flag.set()
        for m in members:
            await asyncio.to_thread(m.join, 30)
