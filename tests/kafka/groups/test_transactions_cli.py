"""`automq transactions list|find-hanging|abort` against a real broker (BrokerService with its
Kafka listener): a hanging transaction (written with verification off, its producer unknown to
any coordinator) is told apart from a live one a confluent-kafka producer holds open, aborted
by its start offset, and the last stable offset moves on to the live one's start."""

from __future__ import annotations

import asyncio
import json

from kio.schema.errors import ErrorCode
from txn_requests import produce, txn_batch  # tests/support
from typer.testing import CliRunner

from automq.broker.cli import app


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


async def test_find_and_abort_a_hanging_transaction(real_cluster) -> None:
    from confluent_kafka import Producer

    service = await real_cluster.start_broker(1, transaction_partition_verification_enable=False)
    broker = service.broker
    await broker.ensure_topic("h", partitions=1)
    p = await broker.partitions.get_when_open("h", 0, 30)
    assert (await produce(broker, 9, "nobody", "h", 0, txn_batch(777, 3, 0))).error_code == ErrorCode.none
    b = ["--bootstrap", service.bootstrap]

    live = Producer({"bootstrap.servers": service.bootstrap, "transactional.id": "live-tx"})

    def open_live() -> None:
        live.init_transactions(60)
        live.begin_transaction()
        live.produce("h", value=b"live", partition=0)
        live.flush(30)

    await asyncio.to_thread(open_live)
    assert p.last_stable_offset == 0

    code, out = await asyncio.to_thread(cli, "transactions", "list", *b, "--output", "json")
    assert code == 0, out
    assert [(t["transactional_id"], t["state"]) for t in json.loads(out)] == [("live-tx", "Ongoing")]

    code, out = await asyncio.to_thread(cli, "transactions", "find-hanging", *b, "--all", "--output", "json")
    assert code == 0, out
    found = {(o["producer_id"], o["start_offset"], o["transactional_id"], o["hanging"]) for o in json.loads(out)}
    live_pid = next(o["producer_id"] for o in json.loads(out) if o["transactional_id"] == "live-tx")
    assert found == {(777, 0, None, True), (live_pid, 2, "live-tx", False)}
    code, table = await asyncio.to_thread(cli, "transactions", "find-hanging", *b)
    assert code == 0 and "777" in table and "live-tx" not in table

    code, out = await asyncio.to_thread(cli, "transactions", "abort", *b, "--topic", "h", "--partition", "0")
    assert code == 2  # which transaction? refused as a usage error
    code, out = await asyncio.to_thread(
        cli, "transactions", "abort", *b, "--topic", "h", "--partition", "0", "--start-offset", "5"
    )
    assert code == 1 and "no transaction starting at offset 5" in out
    code, out = await asyncio.to_thread(
        cli, "transactions", "abort", *b, "--topic", "h", "--partition", "0", "--start-offset", "2"
    )
    assert code == 1 and "live at its coordinator" in out  # the live one is not aborted by mistake
    code, out = await asyncio.to_thread(
        cli, "transactions", "abort", *b, "--topic", "h", "--partition", "0", "--start-offset", "0"
    )
    assert code == 0, out
    assert "producer 777" in out
    assert p.last_stable_offset == 2  # now held only by the live transaction
    code, out = await asyncio.to_thread(cli, "transactions", "find-hanging", *b, "--output", "json")
    assert code == 0 and json.loads(out) == []

    await asyncio.to_thread(live.commit_transaction, 60)
    assert p.last_stable_offset == p.high_watermark
