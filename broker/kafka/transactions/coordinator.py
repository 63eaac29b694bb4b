"""The transaction coordinator as the broker runs it (KIP-98): the asyncio shell around state.py.

Placement and durability follow the group coordinator: a transactional id belongs to
`__transaction_state` partition abs(javaHashCode(id)) % partitions, and the broker leading that
partition coordinates it. Every change of a transaction's metadata is appended to that partition
(log.py) and the reply waits until it is durable, so a coordinator that dies, restarts or moves
is replaced by the partition's next leader, which replays the partition and carries on: it
finishes the transactions it finds in PrepareCommit/PrepareAbort (the markers are written again,
which is harmless: a marker for a transaction already closed in a partition changes nothing) and
aborts the open ones whose timeout passes.

Once the Prepare state is durable the outcome is decided; the markers are then written to every
partition of the transaction at once (locally, or WriteTxnMarkers to their leaders, retried
until each is written or the partition is gone), and the transaction becomes
CompleteCommit/CompleteAbort. Kafka answers EndTxn right after the Prepare write, so the
producer's next AddPartitionsToTxn usually gets CONCURRENT_TRANSACTIONS and waits out a client
retry backoff (librdkafka: ~100 ms per transaction); here EndTxn waits until the markers are
written (at most END_TXN_WAIT_S, then it answers anyway: the decision is already durable), so a
committed transaction is readable when commit returns, and an AddPartitionsToTxn that still
finds the transaction completing waits for it on the broker instead of bouncing. A new
InitProducerId meanwhile gets CONCURRENT_TRANSACTIONS.

Fencing: InitProducerId bumps the epoch; with a transaction open, it first aborts it under a
bumped epoch (its markers carry that epoch, so the old instance's late batches are refused by
the partitions too). A transaction open longer than its timeout is aborted the same way.

Requests for ids whose partition this broker does not lead get NOT_COORDINATOR; while it
replays the partition, COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker.kafka import records as batches
from automq.broker.kafka.groups import log as grouplog
from automq.broker.kafka.groups.state import partition_for
from automq.broker.kafka.transactions import markers
from automq.broker.kafka.transactions.log import TxnKey, TxnValue
from automq.broker.kafka.transactions.state import (
    TxnMetadata,
    TxnState,
    bumped,
    check_producer,
    end_txn_answer,
    needs_new_producer_id,
)

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker
    from automq.broker.kafka.partitions import Partition

log = logging.getLogger(__name__)

TXN_TOPIC = "__transaction_state"
TXN_TOPIC_CONFIGS = {"cleanup.policy": "compact"}
LOAD_READ_BYTES = 4 << 20
MARKER_RETRY_S = (0.05, 2.0)  # first and largest backoff between marker attempts
END_TXN_WAIT_S = 5.0  # EndTxn waits this long at most for the markers before answering
CHECKPOINT_MIN_RECORDS = 10_000
CHECKPOINT_FACTOR = 4


def now_ms() -> int:
    return int(time.time() * 1000)


class NotCoordinatorError(Exception):
    pass


class TransactionCoordinator:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        kafka = broker.config.kafka
        self.num_partitions = kafka.transaction_state_log_num_partitions
        self.max_timeout_ms = kafka.transaction_max_timeout_ms
        self.abort_interval_ms = kafka.transaction_abort_timed_out_transaction_cleanup_interval_ms
        self.id_expiration_ms = kafka.transactional_id_expiration_ms
        self.expire_interval_ms = kafka.transaction_remove_expired_transaction_cleanup_interval_ms
        self.txns: dict[str, TxnMetadata] = {}
        self._partitions: dict[int, Partition] = {}
        self._loading: set[int] = set()
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._completing: dict[str, asyncio.Task[None]] = {}
        self._marked: dict[str, asyncio.Future[None]] = {}  # resolved once a completion's markers are written
        self._records: dict[int, int] = {}  # records appended per partition since its last checkpoint
        # the newest state of an id whose record is being written (None: its tombstone): a
        # checkpoint must rewrite that, not the older state still current until it is durable
        self._pending: dict[str, TxnMetadata | None] = {}
        self._channel = markers.MarkerChannel.for_node(broker.config)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.Task[None] | None = None
        self._expirer: asyncio.Task[None] | None = None
        self._closing = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.broker.partitions.add_listener(self)
        self._timer = asyncio.get_running_loop().create_task(self._abort_timed_out(), name="txn-timeouts")
        self._expirer = asyncio.get_running_loop().create_task(self._expire_ids_periodically(), name="txn-id-expiry")

    async def close(self) -> None:
        self._closing = True
        tasks = [
            t for t in (self._timer, self._expirer, *self._loads.values(), *self._completing.values()) if t is not None
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, *self._tasks, return_exceptions=True)
        await self._channel.close()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---------------------------------------------------------------- partition leadership

    async def on_elected(self, partition: Any) -> None:
        if partition.topic != TXN_TOPIC:
            return
        topic = self.broker.partitions.topic(TXN_TOPIC)
        if topic is not None and topic.partitions:
            self.num_partitions = len(topic.partitions)
        index = partition.partition
        previous = self._loads.pop(index, None)
        if previous is not None:
            previous.cancel()
        self._loading.add(index)
        self._loads[index] = asyncio.get_running_loop().create_task(self._load(partition), name=f"load-txn-{index}")

    async def on_resigned(self, topic: str, partition: int) -> None:
        if topic != TXN_TOPIC:
            return
        load = self._loads.pop(partition, None)
        if load is not None:
            load.cancel()
        self._loading.discard(partition)
        self._partitions.pop(partition, None)
        for tid in [t for t, md in self.txns.items() if md.coordinator_partition == partition]:
            del self.txns[tid]
            task = self._completing.pop(tid, None)
            if task is not None:
                task.cancel()
        log.info("no longer coordinating transactions of %s-%d", TXN_TOPIC, partition)

    async def _load(self, partition: Any) -> None:
        index = partition.partition
        backoff = 0.1
        try:
            while not partition.closed and not self._closing:
                try:
                    loaded = await self._read_all(partition)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("replaying %s-%d failed (%s); retrying in %.1fs", TXN_TOPIC, index, exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                for tid, md in loaded.items():
                    self.txns[tid] = md
                self._partitions[index] = partition
                self._records[index] = len(loaded)
                log.info("coordinating %d transactional ids of %s-%d", len(loaded), TXN_TOPIC, index)
                for tid, md in loaded.items():
                    if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                        self._start_completion(tid)  # the previous coordinator decided; finish it
                return
        finally:
            if self._loads.get(index) is asyncio.current_task():
                del self._loads[index]
                self._loading.discard(index)

    async def _read_all(self, partition: Any) -> dict[str, TxnMetadata]:
        out: dict[str, TxnMetadata] = {}
        offset = partition.log_start_offset
        end = partition.high_watermark
        while offset < end:
            result = await partition.read(offset, LOAD_READ_BYTES)
            if not result.batches:
                break
            for data in result.batches:
                for record_offset, key, value in grouplog.decode_batches(data.payload):
                    if record_offset < offset:
                        continue
                    try:
                        tid = TxnKey.decode(key).transactional_id
                        if value is None:
                            out.pop(tid, None)
                        else:
                            out[tid] = TxnMetadata.from_value(tid, TxnValue.decode(value), partition.partition)
                    except (grouplog.RecordFormatError, UnicodeDecodeError, ValueError) as exc:
                        log.warning(
                            "%s-%d offset %d: unreadable record skipped: %s",
                            TXN_TOPIC,
                            partition.partition,
                            record_offset,
                            exc,
                        )
            offset = max(offset, result.batches[-1].next_offset)
        return out

    # ---------------------------------------------------------------- routing

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    def coordinator_error(self, transactional_id: str) -> ErrorCode | None:
        index = self.partition_for(transactional_id)
        if index in self._loading:
            return ErrorCode.coordinator_load_in_progress
        partition = self._partitions.get(index)
        if partition is None or partition.closed:
            topic = self.broker.partitions.topic(TXN_TOPIC)
            if topic is not None and 0 <= index < len(topic.partitions):
                info = topic.partitions[index]
                if info.leader == self.broker.node_id and info.state == "online":
                    return ErrorCode.coordinator_load_in_progress
            return ErrorCode.not_coordinator
        return None

    @property
    def loading(self) -> bool:
        return bool(self._loading)

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    # ---------------------------------------------------------------- durability

    async def _persist(self, md: TxnMetadata, *, make_current: bool = True) -> bool:
        """Append md's record to its partition; True once durable (then md is current, unless
        the caller made it current already: `make_current=False`)."""
        partition = self._partitions.get(md.coordinator_partition)
        if partition is None or partition.closed:
            return False
        batch = bytearray(
            grouplog.encode_batch([(TxnKey(md.transactional_id).encode(), md.value().encode())], now_ms())
        )
        tid = md.transactional_id
        self._pending[tid] = md
        try:
            await partition.append_batch(batch, batches.parse_header(batch))
        except Exception as exc:
            log.warning("writing transaction state of %r failed: %r", tid, exc)
            return False
        finally:
            if self._pending.get(tid) is md:
                del self._pending[tid]
        if self._partitions.get(md.coordinator_partition) is not partition:
            return False  # resigned while writing: the next coordinator replays it
        if make_current:
            self.txns[md.transactional_id] = md
        count = self._records.get(md.coordinator_partition, 0) + 1
        self._records[md.coordinator_partition] = count
        if count >= CHECKPOINT_MIN_RECORDS:
            self._maybe_checkpoint(md.coordinator_partition)
        return True

    def _maybe_checkpoint(self, index: int) -> None:
        live = [md for md in self.txns.values() if md.coordinator_partition == index]
        if self._records.get(index, 0) < CHECKPOINT_FACTOR * max(len(live), 1):
            return
        self._records[index] = 0
        self._spawn(self._checkpoint(index))

    async def _checkpoint(self, index: int) -> None:
        """Kafka compacts `__transaction_state`; here the live state is written again and the
        log trimmed below it, so replay stays proportional to the live ids."""
        partition = self._partitions.get(index)
        if partition is None:
            return
        start = partition.log_end_offset
        # every id with a record below `start`, including ids whose first record is in flight
        ids = [tid for tid, md in self.txns.items() if md.coordinator_partition == index]
        ids += [
            tid
            for tid, md in self._pending.items()
            if md is not None and md.coordinator_partition == index and tid not in self.txns
        ]
        try:
            for chunk in range(0, len(ids), 500):
                # each id's newest state, read when its chunk's offset is reserved (no await in
                # between): a state written while an earlier chunk was being written is not
                # overwritten by the older one captured when the checkpoint began
                recs: list[tuple[bytes, bytes | None]] = []
                for tid in ids[chunk : chunk + 500]:
                    md = self._pending[tid] if tid in self._pending else self.txns.get(tid)
                    if md is not None:
                        recs.append((TxnKey(tid).encode(), md.value().encode()))
                if not recs:
                    continue
                batch = bytearray(grouplog.encode_batch(recs, now_ms()))
                await partition.append_batch(batch, batches.parse_header(batch))
            if self._partitions.get(index) is partition:
                await partition.stream.trim(start)
                self._records[index] = len(ids)
        except Exception:
            log.exception("checkpoint of %s-%d failed", TXN_TOPIC, index)

    # ---------------------------------------------------------------- InitProducerId

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tuple[ErrorCode, int, int]:
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, -1, -1
        error = self.coordinator_error(transactional_id)
        if error is not None:
            return error, -1, -1
        async with self._lock(transactional_id):
            md = self.txns.get(transactional_id)
            now = now_ms()
            if md is None:
                md = TxnMetadata(
                    transactional_id,
                    self.broker.producer_ids.next_id(),
                    0,
                    timeout_ms,
                    TxnState.EMPTY,
                    last_update_ms=now,
                    coordinator_partition=self.partition_for(transactional_id),
                )
                if not await self._persist(md):
                    return ErrorCode.not_coordinator, -1, -1
                return ErrorCode.none, md.producer_id, md.producer_epoch
            if producer_id >= 0:
                # KIP-360: the client says who it was; a stale instance must not take over
                if producer_id != md.producer_id:
                    return ErrorCode.producer_fenced, -1, -1
                if producer_epoch == md.last_epoch and md.state is TxnState.EMPTY:
                    return ErrorCode.none, md.producer_id, md.producer_epoch  # a retried bump that went through
                if producer_epoch != md.producer_epoch:
                    return ErrorCode.producer_fenced, -1, -1
            if md.state.preparing:
                return ErrorCode.concurrent_transactions, -1, -1
            if md.state is TxnState.ONGOING:
                # fence the previous instance: abort its transaction under a bumped epoch
                if not await self._begin_abort(md, fence=True):
                    return ErrorCode.not_coordinator, -1, -1
                return ErrorCode.concurrent_transactions, -1, -1
            new_pid = self.broker.producer_ids.next_id() if needs_new_producer_id(md) else None
            nxt = bumped(md, now, new_pid).copy(
                state=TxnState.EMPTY, partitions=frozenset(), timeout_ms=timeout_ms, start_ms=-1
            )
            if not await self._persist(nxt):
                return ErrorCode.not_coordinator, -1, -1
            return ErrorCode.none, nxt.producer_id, nxt.producer_epoch

    # ---------------------------------------------------------------- AddPartitionsToTxn / AddOffsetsToTxn

    async def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]]
    ) -> ErrorCode:
        """One error for all the (already validated) partitions."""
        error = self.coordinator_error(transactional_id)
        if error is not None:
            return error
        async with self._lock(transactional_id):
            md = self.txns.get(transactional_id)
            error = check_producer(md, producer_id, producer_epoch)
            if error is not None:
                return error
            assert md is not None
            completing = self._completing.get(transactional_id) if md.state.preparing else None
            if md.state.preparing and completing is None:
                return ErrorCode.concurrent_transactions
        if completing is not None:
            # the previous transaction is finishing: wait here rather than bounce the client
            await asyncio.wait({completing}, timeout=END_TXN_WAIT_S)  # its outcome: re-read below
        async with self._lock(transactional_id):
            md = self.txns.get(transactional_id)
            error = check_producer(md, producer_id, producer_epoch)
            if error is not None:
                return error
            assert md is not None
            if md.state.preparing:
                return ErrorCode.concurrent_transactions
            if md.state is TxnState.ONGOING and set(partitions) <= md.partitions:
                return ErrorCode.none
            now = now_ms()
            ongoing = md.state is TxnState.ONGOING
            nxt = md.copy(
                state=TxnState.ONGOING,
                partitions=(md.partitions if ongoing else frozenset()) | frozenset(partitions),
                start_ms=md.start_ms if ongoing else now,
                last_update_ms=now,
            )
            if not await self._persist(nxt):
                return ErrorCode.not_coordinator
            return ErrorCode.none

    def verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        """AddPartitionsToTxn verify_only (KIP-890 part 1), asked by a partition leader before
        a transactional batch may open a transaction there: is each partition in the
        producer's ongoing transaction? Kafka's answers: a wrong producer id or epoch for the
        whole request, CONCURRENT_TRANSACTIONS while a transaction is completing, else per
        partition NONE or TRANSACTION_ABORTABLE (the handler says INVALID_TXN_STATE to v4)."""
        error = self.coordinator_error(transactional_id)
        md = self.txns.get(transactional_id)
        if error is None:
            error = check_producer(md, producer_id, producer_epoch)
        if error is None and md is not None and md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            error = ErrorCode.concurrent_transactions
        if error is not None:
            return dict.fromkeys(partitions, error)
        assert md is not None
        return {tp: ErrorCode.none if tp in md.partitions else ErrorCode.transaction_abortable for tp in partitions}

    # ---------------------------------------------------------------- EndTxn

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        error = self.coordinator_error(transactional_id)
        if error is not None:
            return error
        async with self._lock(transactional_id):
            md = self.txns.get(transactional_id)
            if (
                md is not None
                and md.producer_id == producer_id
                and producer_epoch == md.last_epoch
                and md.state is TxnState.COMPLETE_ABORT
                and not commit
            ):
                # the abort a fencing bump already did: a retried abort of the old epoch succeeds
                return ErrorCode.none
            error = check_producer(md, producer_id, producer_epoch)
            if error is not None:
                return error
            assert md is not None
            answer, prepare = end_txn_answer(md, commit)
            if answer is not None or prepare is None:
                return answer if answer is not None else ErrorCode.invalid_txn_state
            nxt = md.copy(state=prepare, last_update_ms=now_ms())
            if not await self._persist(nxt):
                return ErrorCode.not_coordinator
            self._start_completion(transactional_id)
            marked = self._marked.get(transactional_id)
        # (outside the lock: the completion takes it to record CompleteCommit/CompleteAbort)
        if marked is not None:
            await asyncio.wait({marked}, timeout=END_TXN_WAIT_S)
        return ErrorCode.none

    async def _begin_abort(self, md: TxnMetadata, *, fence: bool) -> bool:
        """PrepareAbort (with a bumped epoch when fencing), then markers. Caller holds the lock."""
        nxt = md.copy(state=TxnState.PREPARE_ABORT, last_update_ms=now_ms())
        if fence and not needs_new_producer_id(md):
            # (at the end of the epoch space the abort keeps the epoch: markers must carry the
            # producer id of the data; the next InitProducerId moves to a new id anyway)
            nxt = nxt.copy(producer_epoch=md.producer_epoch + 1, last_epoch=md.producer_epoch)
        if not await self._persist(nxt):
            return False
        self._start_completion(md.transactional_id)
        return True

    # ---------------------------------------------------------------- markers and completion

    def _start_completion(self, transactional_id: str) -> asyncio.Task[None] | None:
        if transactional_id in self._completing:
            return self._completing[transactional_id]
        task = asyncio.get_running_loop().create_task(
            self._complete(transactional_id), name=f"txn-markers-{transactional_id}"
        )
        self._completing[transactional_id] = task
        marked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._marked[transactional_id] = marked

        def done(t: asyncio.Task[None]) -> None:
            if self._completing.get(transactional_id) is t:
                del self._completing[transactional_id]
            if self._marked.get(transactional_id) is marked:
                del self._marked[transactional_id]
            if not marked.done():
                marked.set_result(None)

        task.add_done_callback(done)
        return task

    async def _complete(self, transactional_id: str) -> None:
        md = self.txns.get(transactional_id)
        if md is None or md.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return
        commit = md.state is TxnState.PREPARE_COMMIT
        partition = self._partitions.get(md.coordinator_partition)
        if partition is None:
            return
        coordinator_epoch = partition.leader_epoch
        if not await self._write_markers(md, commit, coordinator_epoch):
            return
        marked = self._marked.get(transactional_id)
        if marked is not None and not marked.done():
            marked.set_result(None)
        async with self._lock(transactional_id):
            if self.txns.get(transactional_id) is not md:
                return
            done = md.copy(
                state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                partitions=frozenset(),
                last_update_ms=now_ms(),
            )
            # Every marker is written, so the record only spares a next coordinator sending
            # them again: the state changes now and the producer's next AddPartitionsToTxn need
            # not wait for this write. Its append starts (reserving its offset) in the write
            # task's first step, which asyncio runs before any task woken by releasing the
            # lock, so the log keeps the records of this id in order.
            write = asyncio.ensure_future(self._persist(done, make_current=False))
            self.txns[transactional_id] = done
        if not await write:
            log.warning("transaction %r: markers written, completion not recorded", transactional_id)

    async def _write_markers(self, md: TxnMetadata, commit: bool, coordinator_epoch: int) -> bool:
        """True once every partition has its marker; False when this broker stopped
        coordinating (the next coordinator writes them)."""
        remaining = set(md.partitions)
        backoff = MARKER_RETRY_S[0]
        while remaining:
            if self._closing or self._partitions.get(md.coordinator_partition) is None:
                return False
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for tp in sorted(remaining):
                topic = self.broker.partitions.topic(tp[0])
                if topic is None or not 0 <= tp[1] < len(topic.partitions):
                    remaining.discard(tp)  # deleted with its topic: nothing to mark
                    continue
                leader = self.broker.leader_of(*tp)
                by_leader.setdefault(leader[0] if leader is not None else -1, []).append(tp)
            results: dict[tuple[str, int], ErrorCode] = {}
            sends = []  # every partition at once: their appends share WAL syncs
            for leader_id, tps in by_leader.items():
                if leader_id == self.broker.node_id:
                    sends += [self._mark_local(md, tp, commit, coordinator_epoch) for tp in tps]
                    continue
                endpoint = self.broker.endpoint_of(leader_id) if leader_id >= 0 else None
                if endpoint is None:
                    results.update(dict.fromkeys(tps, ErrorCode.leader_not_available))
                    continue
                sends.append(
                    self._channel.send(
                        endpoint[0], endpoint[1], tps, md.producer_id, md.producer_epoch, commit, coordinator_epoch
                    )
                )
            for answer in await asyncio.gather(*sends):
                results.update(answer)
            for tp, err in results.items():
                if err in (ErrorCode.none, ErrorCode.unknown_topic_or_partition):
                    remaining.discard(tp)
                elif err == ErrorCode.invalid_producer_epoch:
                    # the partition saw a newer epoch of this producer: a later transaction
                    # already superseded this one there
                    log.warning("marker of %r on %s-%d refused: newer epoch seen", md.transactional_id, *tp)
                    remaining.discard(tp)
            if remaining:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MARKER_RETRY_S[1])
        return True

    async def _mark_local(
        self, md: TxnMetadata, tp: tuple[str, int], commit: bool, coordinator_epoch: int
    ) -> dict[tuple[str, int], ErrorCode]:
        error = await markers.write_local(
            self.broker, tp[0], tp[1], md.producer_id, md.producer_epoch, commit, coordinator_epoch
        )
        return {tp: error}

    # ---------------------------------------------------------------- timeouts

    async def _abort_timed_out(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.abort_interval_ms / 1000)
            now = now_ms()
            for tid, md in list(self.txns.items()):
                if md.state is TxnState.ONGOING and md.start_ms >= 0 and now - md.start_ms > md.timeout_ms:
                    self._spawn(self._abort_if_still_timed_out(tid))

    async def _abort_if_still_timed_out(self, transactional_id: str) -> None:
        async with self._lock(transactional_id):
            md = self.txns.get(transactional_id)
            if md is None or md.state is not TxnState.ONGOING or now_ms() - md.start_ms <= md.timeout_ms:
                return
            log.info(
                "aborting transaction of %r: open longer than its timeout of %d ms", transactional_id, md.timeout_ms
            )
            await self._begin_abort(md, fence=True)

    # ---------------------------------------------------------------- transactional id expiration

    async def _expire_ids_periodically(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.expire_interval_ms / 1000)
            try:
                await self.expire_ids(now_ms())
            except Exception:
                log.exception("expiring transactional ids failed; retrying next interval")

    def _expirable(self, md: TxnMetadata, now: int) -> bool:
        return (
            md.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
            and now - md.last_update_ms >= self.id_expiration_ms
            and md.transactional_id not in self._completing
        )

    async def expire_ids(self, now: int) -> list[str]:
        """Forget the transactional ids idle for transactional.id.expiration.ms (Kafka: 7 days)
        with no transaction open or completing: a tombstone in their `__transaction_state`
        partition makes it durable (a replay, and the next checkpoint, drop them). The next
        InitProducerId of such an id starts afresh with a new producer id."""
        expired = []
        for tid, md in list(self.txns.items()):
            if not self._expirable(md, now):
                continue
            async with self._lock(tid):
                current = self.txns.get(tid)  # (re-read: a request may have used the id meanwhile)
                if current is None or not self._expirable(current, now) or not await self._write_tombstone(current):
                    continue
            expired.append(tid)
        if expired:
            log.info("expired %d transactional ids idle for %d ms", len(expired), self.id_expiration_ms)
        return expired

    async def _write_tombstone(self, md: TxnMetadata) -> bool:
        partition = self._partitions.get(md.coordinator_partition)
        if partition is None or partition.closed:
            return False
        batch = bytearray(grouplog.encode_batch([(TxnKey(md.transactional_id).encode(), None)], now_ms()))
        tid = md.transactional_id
        self._pending[tid] = None
        try:
            await partition.append_batch(batch, batches.parse_header(batch))
        except Exception as exc:
            log.warning("expiring transactional id %r failed: %r", tid, exc)
            return False
        finally:
            if tid in self._pending and self._pending[tid] is None:
                del self._pending[tid]
        if self._partitions.get(md.coordinator_partition) is not partition:
            return False  # resigned while writing: the next coordinator replays the tombstone
        if self.txns.get(md.transactional_id) is md:
            del self.txns[md.transactional_id]
        self._records[md.coordinator_partition] = self._records.get(md.coordinator_partition, 0) + 1
        return True

    # ---------------------------------------------------------------- describing

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.txns.get(transactional_id)
