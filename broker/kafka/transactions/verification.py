"""KIP-890 part 1 on the partition leader: a transactional batch that would open a transaction
in a partition is first checked with the producer's transaction coordinator.

Without the check a batch the coordinator never heard of (a client bug, or a batch delayed in
the network until after its transaction aborted) opens a transaction in the partition that no
marker will ever close: a *hanging transaction* that holds the last stable offset, and every
read_committed consumer, back for good. So when a transactional batch arrives for a producer
with no open transaction in the partition, the leader asks the coordinator (locally, or
AddPartitionsToTxn v5 with verify_only to the broker leading the id's `__transaction_state`
partition) whether the partition is in the producer's ongoing transaction, and appends only
if it is. Batches of a transaction already open in the partition append at once: the check
costs one coordinator round trip per transaction and partition, never per batch.

A *verification guard* closes the race with markers: the guard is taken before the question
is asked, a marker of the producer written meanwhile removes it (txn_state.py), and the append
is refused unless the guard is still there, so a verified batch cannot open a transaction after
its transaction was ended.

Produce v12 (KIP-890 part 2: the client does not send AddPartitionsToTxn) asks the coordinator
to add the partition instead of only verifying it.

Errors reach the producer as Kafka gives them (per Produce version): not in the transaction ->
INVALID_TXN_STATE (TRANSACTION_ABORTABLE from v11); a wrong epoch -> INVALID_PRODUCER_EPOCH; a
coordinator that cannot answer now (moving, loading, unreachable, a transaction completing) ->
NOT_ENOUGH_REPLICAS, which every producer retries without refreshing metadata.

Ordering: a producer's later batches for the same partition wait for its batch in
verification (pipelined requests keep their sequence order); other partitions are not held up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from prometheus_client import Counter

from automq.broker.kafka import codec, records
from automq.broker.kafka.groups.state import partition_for
from automq.broker.kafka.producers import ProducerStateError
from automq.broker.kafka.transactions import markers

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker
    from automq.broker.kafka.partitions import AppendResult, Partition

log = logging.getLogger(__name__)

TXN_TOPIC = "__transaction_state"
ADD_PARTITIONS_TO_TXN = 24
VERIFY_VERSION = 5  # the inter-broker form: batched transactions, verify_only, TRANSACTION_ABORTABLE
VERIFY_TIMEOUT_S = 10.0
FIRST_PRODUCE_WITH_ABORTABLE = 11  # Produce v11+ clients know TRANSACTION_ABORTABLE
FIRST_PRODUCE_ADDING = 12  # Produce v12+ (transactions v2): the partition is added, not only verified

_RETRY_LATER = frozenset(
    {
        ErrorCode.network_exception,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
    }
)

Errors = dict[tuple[str, int], ErrorCode]


def produce_error(error: ErrorCode, produce_version: int) -> tuple[ErrorCode, str]:
    """The Produce answer for a failed verification (Kafka's translation)."""
    if error in (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable):
        if produce_version < FIRST_PRODUCE_WITH_ABORTABLE:
            error = ErrorCode.invalid_txn_state
        return error, "Partition was not added to the transaction"
    if error in _RETRY_LATER or (error == ErrorCode.concurrent_transactions and produce_version < FIRST_PRODUCE_ADDING):
        return (
            ErrorCode.not_enough_replicas,
            f"Unable to verify the partition has been added to the transaction. Underlying error: {error.name.upper()}",
        )
    if error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch, "the producer was fenced by a newer instance"
    return error, f"transaction verification failed: {error.name.upper()}"


def txn_offset_commit_error(error: ErrorCode, version: int) -> ErrorCode:
    """The TxnOffsetCommit answer for a failed verification of its `__consumer_offsets`
    partition: a coordinator that cannot answer now is COORDINATOR_LOAD_IN_PROGRESS (clients
    retry without looking the group coordinator up again, which is right), TRANSACTION_ABORTABLE
    from v4 (INVALID_TXN_STATE before)."""
    if error in (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable):
        return ErrorCode.transaction_abortable if version >= 4 else ErrorCode.invalid_txn_state
    if error in _RETRY_LATER or error == ErrorCode.concurrent_transactions:
        return ErrorCode.coordinator_load_in_progress
    return error


class TxnVerifier:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.enabled = broker.config.kafka.transaction_partition_verification_enable
        self._channel = markers.MarkerChannel.for_node(broker.config)  # inter-broker listener and credentials
        # (topic, partition, producer id) -> that producer's newest append waiting for verification
        self._waiting: dict[tuple[str, int, int], asyncio.Future[Any]] = {}
        self.verifications = 0  # coordinator questions asked (tests read it)
        self._outcomes = Counter(
            "kafka_txn_verifications",
            "KIP-890 checks of a transaction's first batch in a partition with its coordinator, by result "
            "(ok, not_in_transaction, fenced, retry: the coordinator could not answer, other)",
            ["result"],
            registry=broker.registry,
        )
        for result in ("ok", "not_in_transaction", "fenced", "retry", "other"):
            self._outcomes.labels(result)  # every series from the start (rates need the zero)

    async def close(self) -> None:
        await self._channel.close()

    def needed(self, partition: Partition, header: records.BatchHeader) -> bool:
        """Must this (validated, transactional) batch be verified before it is appended?"""
        pid = header.producer_id
        return self.enabled and (
            pid not in partition.txns.ongoing or (partition.topic, partition.partition, pid) in self._waiting
        )

    def verify(
        self,
        answer: asyncio.Future[Errors],
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[tuple[str, int]],
        add: bool,
    ) -> None:
        """Ask the coordinator once for all of a request's partitions; the errors go to
        `answer` (created before the appends that wait for it)."""
        self.verifications += 1
        asked = asyncio.ensure_future(self.ask(transactional_id, producer_id, producer_epoch, partitions, add))

        def done(f: asyncio.Future[Errors]) -> None:
            if answer.done():
                return
            if f.cancelled() or f.exception() is not None:
                if not f.cancelled():
                    log.warning("verifying %r failed: %r", transactional_id, f.exception())
                answer.set_result(dict.fromkeys(partitions, ErrorCode.unknown_server_error))
            else:
                answer.set_result(f.result())

        asked.add_done_callback(done)

    def append(
        self,
        partition: Partition,
        batch: bytearray | memoryview,
        header: records.BatchHeader,
        verification: asyncio.Future[Errors],
        produce_version: int,
    ) -> asyncio.Future[AppendResult]:
        """The append of a batch once `verification` allows it (a task, started now so the
        producer's later batches queue behind it)."""
        key = (partition.topic, partition.partition, header.producer_id)
        guard = partition.txns.verification_guard(header.producer_id)  # before the question is asked
        task = asyncio.ensure_future(
            self._append(partition, batch, header, verification, self._waiting.get(key), guard, produce_version)
        )
        self._waiting[key] = task

        def done(t: asyncio.Future[Any]) -> None:
            if self._waiting.get(key) is t:
                del self._waiting[key]

        task.add_done_callback(done)
        return task

    async def _append(
        self,
        partition: Partition,
        batch: bytearray | memoryview,
        header: records.BatchHeader,
        verification: asyncio.Future[Errors],
        previous: asyncio.Future[Any] | None,
        guard: object,
        produce_version: int,
    ) -> AppendResult:
        if previous is not None:
            await asyncio.wait({previous})  # its outcome is its own request's answer
        errors = await asyncio.shield(verification)
        error = errors.get((partition.topic, partition.partition), ErrorCode.unknown_server_error)
        if error != ErrorCode.none:
            pid = header.producer_id
            if partition.txns.verifying.get(pid) is guard and pid not in partition.txns.ongoing:
                del partition.txns.verifying[pid]
            code, message = produce_error(error, produce_version)
            raise ProducerStateError(code, message)
        return await partition.append_batch(batch, header, verification_guard=guard)

    async def verify_offsets(
        self, partition: Partition, transactional_id: str, producer_id: int, producer_epoch: int, version: int
    ) -> tuple[ErrorCode, object | None]:
        """TxnOffsetCommit: before the group coordinator writes the transaction's offsets into
        its `__consumer_offsets` partition, the same check as a Produce's. Returns the error to
        answer (NONE when the write may go ahead) and the guard to append with (None when the
        producer's transaction is already open in the partition)."""
        txns = partition.txns
        if not self.enabled or producer_id in txns:
            return ErrorCode.none, None
        guard = txns.verification_guard(producer_id)
        self.verifications += 1
        tp = (partition.topic, partition.partition)
        error = (await self.ask(transactional_id, producer_id, producer_epoch, [tp], False)).get(
            tp, ErrorCode.unknown_server_error
        )
        if error == ErrorCode.none:
            return error, guard
        if txns.verifying.get(producer_id) is guard and producer_id not in txns:
            del txns.verifying[producer_id]
        return txn_offset_commit_error(error, version), None

    # ---------------------------------------------------------------- asking the coordinator

    def _count(self, errors: Errors) -> Errors:
        for error in errors.values():
            if error == ErrorCode.none:
                result = "ok"
            elif error in (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable):
                result = "not_in_transaction"
            elif error in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_id_mapping):
                result = "fenced"
            elif error in _RETRY_LATER or error == ErrorCode.concurrent_transactions:
                result = "retry"
            else:
                result = "other"
            self._outcomes.labels(result).inc()
        return errors

    async def ask(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]], add: bool
    ) -> Errors:
        """The coordinator's answer for each partition (asked locally or over the wire)."""
        return self._count(await self._ask(transactional_id, producer_id, producer_epoch, partitions, add))

    async def _ask(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]], add: bool
    ) -> Errors:
        broker = self.broker
        topic = broker.partitions.topic(TXN_TOPIC)
        if topic is None or not topic.partitions:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        leader = broker.leader_of(TXN_TOPIC, partition_for(transactional_id, len(topic.partitions)))
        if leader is None or leader[0] < 0:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        if leader[0] == broker.node_id:
            coordinator = broker.transactions
            if add:
                error = await coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions)
                return dict.fromkeys(partitions, error)
            return coordinator.verify(transactional_id, producer_id, producer_epoch, partitions)
        endpoint = broker.endpoint_of(leader[0])
        if endpoint is None:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        request = _request(transactional_id, producer_id, producer_epoch, partitions, add)
        try:
            response = await asyncio.wait_for(self._channel.call(endpoint[0], endpoint[1], request), VERIFY_TIMEOUT_S)
        except Exception as exc:
            log.info("verifying %r with broker %d failed: %r", transactional_id, leader[0], exc)
            return dict.fromkeys(partitions, ErrorCode.network_exception)
        if response.error_code != ErrorCode.none:
            # a client must not see the inter-broker authorization failure (Kafka's rule)
            error = response.error_code
            if error == ErrorCode.cluster_authorization_failed:
                log.warning("broker %d refused verification (CLUSTER_ACTION): allow this broker's principal", leader[0])
                error = ErrorCode.invalid_txn_state
            return dict.fromkeys(partitions, error)
        out: Errors = dict.fromkeys(partitions, ErrorCode.unknown_server_error)
        for result in response.results_by_transaction:
            for t in result.topic_results:
                for p in t.results_by_partition:
                    if (t.name, p.partition_index) in out:
                        out[(t.name, p.partition_index)] = p.partition_error_code
        return out


def _request(
    transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]], add: bool
) -> Any:
    request_cls = codec.request_class(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
    txn_cls = codec.nested(request_cls, "AddPartitionsToTxnTransaction")
    topic_cls = codec.nested(request_cls, "AddPartitionsToTxnTopic")
    by_topic: dict[str, list[int]] = {}
    for topic, index in partitions:
        by_topic.setdefault(topic, []).append(index)
    return request_cls(
        transactions=(
            txn_cls(
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                verify_only=not add,
                topics=tuple(topic_cls(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
            ),
        )
    )
