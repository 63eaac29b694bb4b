"""`automq transactions list|find-hanging|abort`: what Kafka's `kafka-transactions.sh` does,
over the Kafka protocol (any broker of this project or of Kafka answers the same requests).

* `list`: every coordinator's transactional ids with their state (ListTransactions on each broker).
* `find-hanging`: transactions open in a partition (DescribeProducers on each partition leader)
  that no coordinator has in an ongoing or completing transaction including that partition
  (ListTransactions + DescribeTransactions): such a transaction holds the partition's last
  stable offset, and every read_committed consumer, back until someone writes its marker.
  Server-side verification (KIP-890) keeps new ones from appearing; these are left by a broker
  with it turned off, or by an older one.
* `abort`: writes an ABORT marker for one producer in one partition (WriteTxnMarkers to the
  leader, which requires CLUSTER_ACTION when an authorizer runs), the producer found by the
  transaction's start offset (as `find-hanging` prints it) or given by id and epoch. Unlike
  Kafka's tool it refuses, without --force, a transaction its coordinator still owns: aborting
  one partition of a live transaction would break its atomicity.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from automq.broker.admin.cli import BOOTSTRAP, COMMAND_CONFIG, DATA_DIR, OUTPUT, _json, _run, _table

if TYPE_CHECKING:
    from automq.broker.admin.kafka import AdminClient

transactions_app = typer.Typer(
    help="List transactions, find hanging ones (holding read_committed consumers back) and abort them.",
    no_args_is_help=True,
)

_ALIVE = ("Ongoing", "PrepareCommit", "PrepareAbort")  # a coordinator still owns the partitions


@dataclass(frozen=True)
class TransactionSummary:
    transactional_id: str
    producer_id: int
    state: str
    coordinator: int


@dataclass(frozen=True)
class OpenTransaction:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp_ms: int
    transactional_id: str | None  # None: no coordinator knows the producer
    hanging: bool


def _check(code: Any, what: str) -> None:
    from kio.schema.errors import ErrorCode

    from automq.broker.balancer.kafka_admin import KafkaAdminError

    if code != ErrorCode.none:
        raise KafkaAdminError(f"{what}: {code.name.upper()}", code)


async def list_transactions(admin: AdminClient) -> list[TransactionSummary]:
    from kio.schema.list_transactions.v1.request import ListTransactionsRequest
    from kio.static.primitive import i64

    meta = await admin.metadata()

    async def ask(broker: int) -> list[TransactionSummary]:
        r: Any = await admin._to(
            broker, ListTransactionsRequest(state_filters=(), producer_id_filters=(), duration_filter=i64(-1))
        )
        _check(r.error_code, f"list transactions on broker {broker}")
        return [
            TransactionSummary(t.transactional_id, t.producer_id, t.transaction_state, broker)
            for t in r.transaction_states
        ]

    found = await asyncio.gather(*(ask(b) for b in meta.brokers))
    return sorted((t for part in found for t in part), key=lambda t: t.transactional_id)


async def _coordinator_partitions(admin: AdminClient, summary: TransactionSummary) -> set[tuple[str, int]]:
    """The partitions of `summary`'s transaction as its coordinator describes it now."""
    from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
    from kio.schema.types import TransactionalId

    r: Any = await admin._to(
        summary.coordinator, DescribeTransactionsRequest(transactional_ids=(TransactionalId(summary.transactional_id),))
    )
    out: set[tuple[str, int]] = set()
    for t in r.transaction_states:
        if t.error_code == 0 and t.producer_id == summary.producer_id and t.transaction_state in _ALIVE:
            out |= {(topic.topic, p) for topic in t.topics for p in topic.partitions}
    return out


async def open_transactions(admin: AdminClient) -> list[OpenTransaction]:
    """Every transaction open in some partition, marked hanging when no coordinator has it."""
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
    from kio.schema.types import TopicName
    from kio.static.primitive import i32

    meta = await admin.metadata()
    by_leader: dict[int, dict[str, list[int]]] = {}
    for (topic, index), leader in meta.leaders.items():
        if leader >= 0:
            by_leader.setdefault(leader, {}).setdefault(topic, []).append(index)

    async def ask(broker: int, topics: dict[str, list[int]]) -> list[tuple[str, int, Any]]:
        request = DescribeProducersRequest(
            topics=tuple(
                TopicRequest(name=TopicName(t), partition_indexes=tuple(i32(p) for p in ps)) for t, ps in topics.items()
            )
        )
        r: Any = await admin._to(broker, request)
        return [
            (t.name, p.partition_index, a)
            for t in r.topics
            for p in t.partitions
            if p.error_code == 0
            for a in p.active_producers
            if a.current_txn_start_offset >= 0
        ]

    found = await asyncio.gather(*(ask(b, ts) for b, ts in by_leader.items()))
    opened = [o for part in found for o in part]
    if not opened:
        return []
    pids = {a.producer_id for _, _, a in opened}
    known = [t for t in await list_transactions(admin) if t.producer_id in pids]
    covered: dict[int, set[tuple[str, int]]] = {}
    ids: dict[int, str] = {}
    for summary, parts in zip(
        known, await asyncio.gather(*(_coordinator_partitions(admin, t) for t in known)), strict=True
    ):
        ids[summary.producer_id] = summary.transactional_id
        covered.setdefault(summary.producer_id, set()).update(parts)
    return sorted(
        (
            OpenTransaction(
                topic,
                index,
                a.producer_id,
                a.producer_epoch,
                a.coordinator_epoch,
                a.current_txn_start_offset,
                a.last_timestamp,
                ids.get(a.producer_id),
                (topic, index) not in covered.get(a.producer_id, set()),
            )
            for topic, index, a in opened
        ),
        key=lambda o: (o.topic, o.partition, o.start_offset),
    )


async def abort_transaction(
    admin: AdminClient, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int
) -> None:
    from kio.schema.types import ProducerId, TopicName
    from kio.schema.write_txn_markers.v1.request import (
        WritableTxnMarker,
        WritableTxnMarkerTopic,
        WriteTxnMarkersRequest,
    )
    from kio.static.primitive import i16, i32

    meta = await admin.metadata([topic])
    leader = meta.leaders.get((topic, partition), -1)
    if leader < 0:
        _check(meta.errors.get((topic, partition), meta.topic_errors.get(topic)), f"{topic}-{partition}")
    request = WriteTxnMarkersRequest(
        markers=(
            WritableTxnMarker(
                producer_id=ProducerId(producer_id),
                producer_epoch=i16(producer_epoch),
                transaction_result=False,
                topics=(WritableTxnMarkerTopic(name=TopicName(topic), partition_indexes=(i32(partition),)),),
                coordinator_epoch=i32(coordinator_epoch),
            ),
        )
    )
    r: Any = await admin._to(leader, request)
    _check(r.markers[0].topics[0].partitions[0].error_code, f"abort in {topic}-{partition}")


# ---------------------------------------------------------------------------- commands


@transactions_app.command("list")
def transactions_list(
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
) -> None:
    """Transactional ids with their producer id, state and coordinator."""
    found = _run(bootstrap, command_config, data_dir, output, list_transactions)
    if output == "json":
        _json(found)
    else:
        _table(
            None,
            ["transactional id", "producer id", "state", "coordinator"],
            [[t.transactional_id, t.producer_id, t.state, t.coordinator] for t in found],
        )


@transactions_app.command("find-hanging")
def transactions_find_hanging(
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
    all_open: bool = typer.Option(False, "--all", help="Every open transaction, not only hanging ones."),
) -> None:
    """Transactions open in a partition that no coordinator is going to end."""
    found = _run(bootstrap, command_config, data_dir, output, open_transactions)
    shown = found if all_open else [o for o in found if o.hanging]
    if output == "json":
        _json(shown)
    else:
        _table(
            None,
            ["topic", "partition", "start offset", "producer id", "epoch", "transactional id", "hanging"],
            [
                [o.topic, o.partition, o.start_offset, o.producer_id, o.producer_epoch, o.transactional_id, o.hanging]
                for o in shown
            ],
        )


@transactions_app.command("abort")
def transactions_abort(
    topic: str = typer.Option(..., "--topic", help="Topic of the partition."),
    partition: int = typer.Option(..., "--partition", help="Partition index."),
    start_offset: int | None = typer.Option(
        None, "--start-offset", help="The transaction's first offset in the partition (find-hanging prints it)."
    ),
    producer_id: int | None = typer.Option(None, "--producer-id", help="Instead of --start-offset."),
    producer_epoch: int | None = typer.Option(None, "--producer-epoch", help="With --producer-id."),
    coordinator_epoch: int = typer.Option(-1, "--coordinator-epoch", help="With --producer-id."),
    force: bool = typer.Option(
        False, "--force", help="Abort even a transaction its coordinator still owns (breaks its atomicity)."
    ),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
) -> None:
    """Write an ABORT marker for one producer's open transaction in one partition."""
    if (start_offset is None) == (producer_id is None) or (producer_id is not None and producer_epoch is None):
        typer.echo("give --start-offset, or --producer-id with --producer-epoch", err=True)
        raise typer.Exit(2)

    async def go(admin: AdminClient) -> OpenTransaction | None:
        if producer_id is not None and producer_epoch is not None:
            await abort_transaction(admin, topic, partition, producer_id, producer_epoch, coordinator_epoch)
            return None
        match = [
            o
            for o in await open_transactions(admin)
            if (o.topic, o.partition, o.start_offset) == (topic, partition, start_offset)
        ]
        if not match:
            from automq.broker.balancer.kafka_admin import KafkaAdminError

            raise KafkaAdminError(f"no transaction starting at offset {start_offset} is open in {topic}-{partition}")
        o = match[0]
        if not o.hanging and not force:
            from automq.broker.balancer.kafka_admin import KafkaAdminError

            raise KafkaAdminError(
                f"the transaction of {o.transactional_id!r} is live at its coordinator (not hanging): it will be "
                "committed or aborted there; --force aborts it in this partition anyway"
            )
        await abort_transaction(admin, topic, partition, o.producer_id, o.producer_epoch, o.coordinator_epoch)
        return o

    aborted = _run(bootstrap, command_config, data_dir, "table", go)
    who = f"producer {aborted.producer_id} (epoch {aborted.producer_epoch})" if aborted else f"producer {producer_id}"
    typer.echo(f"aborted the transaction of {who} in {topic}-{partition}")
