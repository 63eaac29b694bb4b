"""`automq groups list|describe` show share groups: two librdkafka ShareConsumers on a real
broker, the group configured with share.auto.offset.reset=earliest through the admin client
(a group config), every record acknowledged; the CLI lists the group by type and describes
its members, their shared partitions, each share-partition's start offset and lag."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from typer.testing import CliRunner

TOPIC = "share-cli"
PARTITIONS = 4
GROUP = "share-cli-grp"
RECORDS = 40
FAST = {"group_share_heartbeat_interval_ms": 300, "group_share_session_timeout_ms": 20_000}


def produce(bootstrap: str, start: int, count: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(start, start + count):
        p.produce(TOPIC, value=str(i).encode(), partition=i % PARTITIONS)
    assert p.flush(30) == 0


def earliest(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, GROUP, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


class Member(threading.Thread):
    def __init__(self, bootstrap: str, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap = bootstrap
        self.values: list[int] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import ShareConsumer

        try:
            c = ShareConsumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": GROUP,
                    "client.id": self.name,
                    "share.acknowledgement.mode": "explicit",
                }
            )
            c.subscribe([TOPIC])
            while not self.stop_flag.is_set():
                batch = [m for m in c.poll(0.2) if m.error() is None]
                for m in batch:
                    c.acknowledge(m)
                if batch:
                    c.commit_sync(30)
                    self.values += [int(m.value()) for m in batch]
            c.close()
        except BaseException as exc:
            self.error = exc


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
async def test_groups_cli_shows_share_groups(real_cluster) -> None:
    service = await real_cluster.start_broker(1, **FAST)
    await service.broker.ensure_topic(TOPIC, partitions=PARTITIONS)
    bootstrap = service.bootstrap
    await asyncio.to_thread(earliest, bootstrap)
    await asyncio.to_thread(produce, bootstrap, 0, RECORDS)  # before anyone joined: earliest matters
    members = [Member(bootstrap, f"share-cli-{n}") for n in "ab"]
    for m in members:
        m.start()
    manager = service.broker.groups.manager
    b = ("--bootstrap", bootstrap)
    try:

        def settled() -> bool:
            group = manager.groups.get(GROUP)
            return (
                group is not None
                and group.share is not None
                and len(group.share.members) == 2
                and all(m.member_epoch == group.share.assignment_epoch for m in group.share.members.values())
                and sum(len(m.values) for m in members) >= RECORDS
            )

        await wait_for(
            lambda: any(m.error for m in members) or settled(),
            state=lambda: ([(m.name, len(m.values)) for m in members], manager.groups.get(GROUP)),
        )
        assert [m.error for m in members] == [None, None]
        assert sorted(v for m in members for v in m.values) == list(range(RECORDS))  # earliest, each once

        code, out = await asyncio.to_thread(cli, "groups", "list", *b, "--type", "share", "--output", "json")
        assert code == 0, out
        assert [(g["group_id"], g["type"], g["state"]) for g in json.loads(out)] == [(GROUP, "share", "Stable")]
        code, out = await asyncio.to_thread(cli, "groups", "list", *b, "--type", "consumer", "--output", "json")
        assert code == 0 and GROUP not in {g["group_id"] for g in json.loads(out)}

        # the acknowledgements' state writes finish after commit_sync answers: wait for lag 0
        async def describe() -> dict:
            code, out = await asyncio.to_thread(cli, "groups", "describe", GROUP, *b, "--output", "json")
            assert code == 0, out
            return json.loads(out)

        deadline = time.monotonic() + 30
        detail = await describe()
        while detail["total_lag"] != 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            detail = await describe()
        data = manager.groups[GROUP].share
        assert detail["type"] == "share" and detail["state"] == "Stable" and detail["assignor"] == "simple"
        assert (detail["group_epoch"], detail["assignment_epoch"]) == (data.group_epoch, data.assignment_epoch)
        assert {m["client_id"] for m in detail["members"]} == {"share-cli-a", "share-cli-b"}
        assigned = [sorted(p for _, p in m["assignment"]) for m in detail["members"]]
        assert sorted(p for ps in assigned for p in ps) == list(range(PARTITIONS))  # 2 members, 4 partitions
        rows = {o["partition"]: (o["committed"], o["end_offset"], o["lag"]) for o in detail["offsets"]}
        assert rows == dict.fromkeys(range(PARTITIONS), (RECORDS // PARTITIONS, RECORDS // PARTITIONS, 0))
        owners = {o["partition"]: o["owner"] for o in detail["offsets"]}
        ids = {m["member_id"] for m in detail["members"]}
        assert all(owner in ids for owner in owners.values())

        code, table = await asyncio.to_thread(cli, "groups", "describe", GROUP, *b)
        assert code == 0, table
        assert "share group, KIP-932" in table and "share-partitions" in table and "start offset" in table
    finally:
        for m in members:
            m.stop_flag.set()
        for m in members:
            await asyncio.to_thread(m.join, 30)

    # members gone (they left on close): records produced now wait, counted as lag
    await wait_for(lambda: not manager.groups[GROUP].share.members, 30)
    await asyncio.to_thread(produce, bootstrap, RECORDS, 2 * PARTITIONS)
    code, out = await asyncio.to_thread(cli, "groups", "describe", GROUP, *b, "--output", "json")
    assert code == 0, out
    detail = json.loads(out)
    assert detail["state"] == "Empty" and detail["members"] == []
    assert detail["total_lag"] == 2 * PARTITIONS
    assert {o["partition"]: o["end_offset"] - o["committed"] for o in detail["offsets"]} == dict.fromkeys(
        range(PARTITIONS), 2
    )
