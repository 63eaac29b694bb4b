"""The group coordinator as the broker runs it: the asyncio shell around `state.GroupManager`.

It owns, for this broker:
- which `__consumer_offsets` partitions it coordinates (it listens to the PartitionManager:
  `on_elected` replays the partition's stream to rebuild groups and offsets — requests for
  those groups get COORDINATOR_LOAD_IN_PROGRESS meanwhile — and `on_resigned` drops them);
- durability: every record the state machine asks for is appended to the group's partition
  (as a v2 batch, `log.py`) and replies wait until the append is durable, so an acknowledged
  OffsetCommit survives a broker restart or a coordinator move;
- time: one task sleeps until the state machine's next deadline (session, rebalance, sync
  and join timeouts) and ticks it; offsets retention runs every minute.

Requests for groups whose partition this broker does not lead get NOT_COORDINATOR (clients
then ask FindCoordinator again).

Transactional offsets (TxnOffsetCommit, KIP-98/KIP-447): written to the group's partition as a
transactional batch under the producer's id and epoch, held as *pending* until the
transaction's marker reaches that partition: COMMIT makes them the group's committed offsets,
ABORT drops them. Replay does the same with the markers it finds in the log.

Log compaction: Kafka compacts `__consumer_offsets`; here, when a partition's log holds many
more records than live state, the coordinator appends a checkpoint (every live record again)
and trims the stream below it, so replay stays proportional to the live state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from automq.broker import group_configs
from automq.broker.kafka import records as batches
from automq.broker.kafka.groups import log as grouplog
from automq.broker.kafka.groups.consumer import (
    CONSUMER_GROUP_STATES,
    STABLE,
    HeartbeatRequest,
    HeartbeatResult,
    TopicMeta,
    TopicView,
    names_by_id,
)
from automq.broker.kafka.groups.model import (
    OFFSET_METADATA_MAX_BYTES,
    CommitPlan,
    CommittedOffset,
    Effects,
    GroupConfig,
    GroupState,
    JoinResult,
    SyncResult,
    Write,
)
from automq.broker.kafka.groups.share import SHARE_GROUP_STATES, ShareHeartbeatRequest, ShareHeartbeatResult
from automq.broker.kafka.groups.share_admin import ShareStateRouter
from automq.broker.kafka.groups.state import GroupManager
from automq.broker.kafka.producers import ProducerStateError
from automq.broker.kafka.topic_ids import topic_uuid

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker
    from automq.broker.kafka.partitions import Partition

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
# As in Kafka, the offsets topic is compacted, never trimmed by time or size retention: the
# coordinator's checkpoints are its compaction, and an idle group's offsets must not age out
# of the log before offsets.retention.ms says so.
OFFSETS_TOPIC_CONFIGS = {"cleanup.policy": "compact"}
RETENTION_CHECK_INTERVAL_MS = 60_000
LOAD_READ_BYTES = 4 << 20
# Checkpoint a partition when it holds this many records beyond CHECKPOINT_FACTOR x live state.
CHECKPOINT_MIN_RECORDS = 20_000
CHECKPOINT_FACTOR = 4
MAX_RECORDS_PER_BATCH = 1_000


def now_ms() -> int:
    return int(time.time() * 1000)


class _PendingWrite:
    __slots__ = ("ok", "records", "tasks")

    def __init__(self) -> None:
        self.records: dict[int, list[tuple[bytes, bytes | None]]] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.ok = True


class _GroupMetrics:
    """Prometheus collector: groups by type and state, members, loaded offsets partitions,
    commits, KIP-848 rebalances (group epoch bumps) and member fencings."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator
        self.commits = 0

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self._coordinator
        manager = c.manager
        groups = GaugeMetricFamily(
            "kafka_coordinator_groups",
            "Groups this broker coordinates, by type (classic, consumer: KIP-848, share: KIP-932) and state",
            labels=["type", "state"],
        )
        # every (type, state) pair is always exported, so a dashboard sees zeros, not gaps
        counts: dict[tuple[str, str], int] = {("classic", s.value): 0 for s in GroupState}
        counts.update({("consumer", s): 0 for s in CONSUMER_GROUP_STATES})
        counts.update({("share", s): 0 for s in SHARE_GROUP_STATES})
        members = {"classic": 0, "consumer": 0, "share": 0}
        unreconciled = 0
        for g in manager.groups.values():
            if g.share is not None:
                counts[("share", g.share.state_name())] += 1
                members["share"] += len(g.share.members)
                continue
            data = g.consumer
            if data is None:
                counts[("classic", g.state.value)] += 1
                members["classic"] += len(g.members)
                continue
            counts[("consumer", data.state_name())] += 1
            members["consumer"] += len(data.members)
            unreconciled += sum(
                1 for m in data.members.values() if m.member_epoch != data.assignment_epoch or m.state != STABLE
            )
        for (kind, state), n in counts.items():
            groups.add_metric([kind, state], n)
        yield groups
        by_type = GaugeMetricFamily(
            "kafka_coordinator_members", "Members of the groups this broker coordinates, by group type", labels=["type"]
        )
        for kind, n in members.items():
            by_type.add_metric([kind], n)
        yield by_type
        yield GaugeMetricFamily(
            "kafka_coordinator_consumer_members_reconciling",
            "KIP-848 members not yet at their group's assignment epoch or still revoking/awaiting partitions",
            value=unreconciled,
        )
        yield CounterMetricFamily(
            "kafka_coordinator_consumer_group_rebalances",
            "KIP-848 group epoch bumps (each one a rebalance: membership, subscriptions or partitions changed)",
            value=manager.consumer_rebalances,
        )
        fencings = CounterMetricFamily(
            "kafka_coordinator_consumer_member_fencings",
            "KIP-848 members fenced: a heartbeat with a wrong epoch (epoch), a silent session (session_timeout), "
            "partitions not revoked in time (rebalance_timeout)",
            labels=["reason"],
        )
        for reason, n in manager.consumer_fencings.items():
            fencings.add_metric([reason], n)
        yield fencings
        migrations = CounterMetricFamily(
            "kafka_coordinator_group_migrations",
            "Non-empty groups converted online between the classic and the KIP-848 protocol "
            "(group.consumer.migration.policy), by direction (upgrade: to KIP-848, downgrade: to classic)",
            labels=["direction"],
        )
        for direction, n in manager.migrations.items():
            migrations.add_metric([direction], n)
        yield migrations
        yield CounterMetricFamily(
            "kafka_coordinator_share_group_rebalances",
            "KIP-932 share group epoch bumps (membership, subscriptions or partitions changed)",
            value=manager.share_rebalances,
        )
        share_fencings = CounterMetricFamily(
            "kafka_coordinator_share_member_fencings",
            "KIP-932 share group members fenced: a heartbeat with a wrong epoch (epoch), a silent session "
            "(session_timeout)",
            labels=["reason"],
        )
        for reason, n in manager.share_fencings.items():
            share_fencings.add_metric([reason], n)
        yield share_fencings
        yield GaugeMetricFamily(
            "kafka_coordinator_partitions_loaded", "__consumer_offsets partitions loaded here", value=len(c._partitions)
        )
        yield GaugeMetricFamily(
            "kafka_coordinator_partitions_loading",
            "__consumer_offsets partitions being replayed",
            value=len(c._loading),
        )
        yield CounterMetricFamily(
            "kafka_coordinator_offset_commits", "Partition offsets committed durably", value=self.commits
        )


class GroupCoordinator:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        kafka = broker.config.kafka
        self.config = GroupConfig(
            min_session_timeout_ms=kafka.group_min_session_timeout_ms,
            max_session_timeout_ms=kafka.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=kafka.group_initial_rebalance_delay_ms,
            offsets_retention_ms=kafka.offsets_retention_ms,
            consumer_session_timeout_ms=kafka.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=kafka.group_consumer_heartbeat_interval_ms,
            consumer_assignors=tuple(kafka.group_consumer_assignors),
            consumer_migration_policy=kafka.group_consumer_migration_policy,
            share_enable=kafka.group_share_enable,
            share_session_timeout_ms=kafka.group_share_session_timeout_ms,
            share_heartbeat_interval_ms=kafka.group_share_heartbeat_interval_ms,
            share_max_size=kafka.group_share_max_size,
        )
        self.num_partitions = kafka.offsets_topic_num_partitions
        self.manager = GroupManager(self.config, self.num_partitions)
        self.manager.topic_view = self.topic_view
        # per group, on every timer pass: a lookup in the image's group configs, the broker's
        # value when the group sets none
        self.manager.share_session_timeout = lambda group_id: self._group_int(
            group_id, "share.session.timeout.ms", self.config.share_session_timeout_ms
        )
        self.manager.consumer_session_timeout = lambda group_id: self._group_int(
            group_id, "consumer.session.timeout.ms", self.config.consumer_session_timeout_ms
        )
        self._view: TopicView = {}
        self._view_image: object = None
        self._partitions: dict[int, Partition] = {}  # loaded partition index
        self._loading: set[int] = set()
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._fixing_config = False
        self._records_since_checkpoint: dict[int, int] = {}
        self._inflight: dict[int, int] = {}  # partition -> appends not yet durable
        self._checkpointing: set[int] = set()
        # pending transactional offsets: partition -> producer id -> group -> {(topic, partition): offset}
        self._txn_offsets: dict[int, dict[int, dict[str, dict[tuple[str, int], CommittedOffset]]]] = {}
        self._wakeup = asyncio.Event()
        self._closing = False
        self._timer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._share_listeners: list[Callable[[str, str], None]] = []
        self.share_state = ShareStateRouter(broker)
        self._share_inits: dict[str, asyncio.Task[None]] = {}
        self.metrics = _GroupMetrics(self)
        registry = getattr(broker, "registry", None)
        if registry is not None:
            registry.register(self.metrics)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.broker.partitions.add_listener(self)
        self._timer = asyncio.get_running_loop().create_task(self._run_timers(), name="group-coordinator-timers")

    async def close(self) -> None:
        # Stop the timer loop by flag, not by cancel: cancelling a task blocked in wait_for
        # can be swallowed when the awaited event fires at the same moment (Python 3.11).
        self._closing = True
        self._wakeup.set()
        if self._timer is not None:
            try:
                await self._timer
            except Exception:
                log.exception("group coordinator timer failed")
            self._timer = None
        for load in list(self._loads.values()):
            load.cancel()
        await asyncio.gather(*self._loads.values(), return_exceptions=True)
        self._loads.clear()
        for p in list(self._partitions):
            self._deliver(self.manager.unload(p).replies)
        self._partitions.clear()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.share_state.close()

    # ---------------------------------------------------------------- partition leadership

    async def on_elected(self, partition: Any) -> None:
        """Start replaying the partition (in a task: a slow or failing read must not hold up
        the partition manager); requests for its groups get COORDINATOR_LOAD_IN_PROGRESS."""
        if partition.topic != OFFSETS_TOPIC:
            return
        index = partition.partition
        topic = self.broker.partitions.topic(OFFSETS_TOPIC)
        if topic is not None and topic.partitions:
            # the topic's real partition count decides placement (FindCoordinator uses it too)
            self.manager.num_partitions = self.num_partitions = len(topic.partitions)
        if (
            topic is not None
            and topic.configs.get("cleanup.policy") != OFFSETS_TOPIC_CONFIGS["cleanup.policy"]
            and not self._fixing_config
        ):
            # created some other way (e.g. auto-created by a Metadata request): fix it
            self._fixing_config = True
            self._spawn(self._make_compacted())
        previous = self._loads.pop(index, None)
        if previous is not None:
            previous.cancel()
        self._loading.add(index)
        task = asyncio.get_running_loop().create_task(self._load(partition), name=f"load-{OFFSETS_TOPIC}-{index}")
        self._loads[index] = task

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _make_compacted(self) -> None:
        try:
            await self.broker.cluster.alter_topic_configs(OFFSETS_TOPIC, dict(OFFSETS_TOPIC_CONFIGS))
            log.info("set %s on %s", OFFSETS_TOPIC_CONFIGS, OFFSETS_TOPIC)
        except Exception as exc:
            log.warning("could not set %s on %s: %s", OFFSETS_TOPIC_CONFIGS, OFFSETS_TOPIC, exc)
        finally:
            self._fixing_config = False

    async def _load(self, partition: Any) -> None:
        index = partition.partition
        backoff = 0.1
        try:
            while not getattr(partition, "closed", False) and not self._closing:
                try:
                    records, pending = await self._read_all(partition)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("replaying %s-%d failed (%s); retrying in %.1fs", OFFSETS_TOPIC, index, exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                self.manager.load(index, records, now_ms())
                if pending:
                    self._txn_offsets[index] = pending
                self._partitions[index] = partition
                self._records_since_checkpoint[index] = len(records)
                log.info("coordinating %s-%d: %d records replayed", OFFSETS_TOPIC, index, len(records))
                for g in [g for g in self.manager.groups.values() if g.partition == index and g.share is not None]:
                    self._initialize_share_partitions(g.group_id)  # what the previous coordinator left undone
                return
        finally:
            if self._loads.get(index) is asyncio.current_task():
                del self._loads[index]
                self._loading.discard(index)
            self._wakeup.set()

    async def on_resigned(self, topic: str, partition: int) -> None:
        if topic != OFFSETS_TOPIC:
            return
        load = self._loads.pop(partition, None)
        if load is not None:
            load.cancel()
        self._partitions.pop(partition, None)
        self._loading.discard(partition)
        self._records_since_checkpoint.pop(partition, None)
        self._txn_offsets.pop(partition, None)
        self._deliver(self.manager.unload(partition).replies)
        log.info("no longer coordinating %s-%d", OFFSETS_TOPIC, partition)

    async def _read_all(self, partition: Any) -> tuple[list[tuple[object, object | None]], dict[int, Any]]:
        """The partition's records in log order, transactional ones placed where their
        COMMIT marker is (aborted ones dropped), and the still-pending transactional offsets."""
        out: list[tuple[object, object | None]] = []
        txn: dict[int, list[tuple[object, object | None]]] = {}
        offset = partition.log_start_offset
        end = partition.high_watermark
        while offset < end:
            result = await partition.read(offset, LOAD_READ_BYTES)
            if not result.batches:
                break
            for data in result.batches:
                if data.base_offset < offset:
                    continue  # the first batch may start before where we asked
                header = batches.parse_header(data.payload)
                if header.is_control:
                    kind = batches.control_type(data.payload, header)
                    done = txn.pop(header.producer_id, [])
                    if kind == batches.CONTROL_COMMIT:
                        out.extend(done)
                    continue
                target = txn.setdefault(header.producer_id, []) if header.is_transactional else out
                for record_offset, key, value in grouplog.decode_batches(data.payload):
                    try:
                        k = grouplog.decode_key(key)
                        v: object | None = None
                        if value is not None:
                            if isinstance(k, grouplog.GroupKey):
                                v = grouplog.GroupValue.decode(value)
                            elif isinstance(k, (grouplog.ConsumerGroupKey, grouplog.ShareGroupKey)):
                                v = value  # JSON, parsed by GroupManager.load
                            else:
                                v = grouplog.OffsetValue.decode(value)
                    except (grouplog.RecordFormatError, UnicodeDecodeError) as exc:
                        log.warning(
                            "%s-%d offset %d: unreadable record skipped: %s",
                            OFFSETS_TOPIC,
                            partition.partition,
                            record_offset,
                            exc,
                        )
                        continue
                    target.append((k, v))
            offset = max(offset, result.batches[-1].next_offset)
        pending: dict[int, dict[str, dict[tuple[str, int], CommittedOffset]]] = {}
        for producer_id, recs in txn.items():
            for rk, rv in recs:
                if isinstance(rk, grouplog.OffsetKey) and isinstance(rv, grouplog.OffsetValue):
                    pending.setdefault(producer_id, {}).setdefault(rk.group_id, {})[(rk.topic, rk.partition)] = (
                        CommittedOffset(rv.offset, rv.leader_epoch, rv.metadata, rv.commit_timestamp_ms)
                    )
        return out, pending

    # ---------------------------------------------------------------- routing

    def partition_for(self, group_id: str) -> int:
        return self.manager.partition_for(group_id)

    def coordinator_error(self, group_id: str) -> ErrorCode | None:
        """NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS when this broker cannot serve the group now."""
        p = self.partition_for(group_id)
        if p in self._loading:
            return ErrorCode.coordinator_load_in_progress
        partition = self._partitions.get(p)
        if partition is None or getattr(partition, "closed", False):
            if self._placed_here(p):
                # the controller put the partition here and it is being opened: retry here
                return ErrorCode.coordinator_load_in_progress
            return ErrorCode.not_coordinator
        return None

    def _placed_here(self, index: int) -> bool:
        topic = self.broker.partitions.topic(OFFSETS_TOPIC)
        if topic is None or not 0 <= index < len(topic.partitions):
            return False
        info = topic.partitions[index]
        return info.leader == self.broker.node_id and info.state == "online"

    @property
    def loading(self) -> bool:
        return bool(self._loading)

    # ---------------------------------------------------------------- effects

    async def apply(self, fx: Effects) -> None:
        """Persist fx.writes, then deliver fx.replies (NOT_COORDINATOR if the writes failed)."""
        await self._finish_apply(fx, self._begin_write(fx.writes))

    def apply_soon(self, fx: Effects) -> None:
        """apply() without waiting (timers); the appends are started now, in call order."""
        pending = self._begin_write(fx.writes)
        task = asyncio.get_running_loop().create_task(self._finish_apply(fx, pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _apply_if_any(self, fx: Effects) -> None:
        """Timer effects: applying an empty one would still wake the timer (see _finish_apply),
        which then ticks again at once: a busy loop that ate most of a core on an idle broker.
        A tick that changed only deadlines needs no wake-up: the loop re-reads them anyway."""
        if fx.writes or fx.replies:
            self.apply_soon(fx)

    async def _finish_apply(self, fx: Effects, pending: _PendingWrite) -> bool:
        ok = await self._finish_write(pending)
        replies = fx.replies
        if not ok:
            replies = [
                (
                    t,
                    JoinResult(ErrorCode.not_coordinator, r.member_id)
                    if isinstance(r, JoinResult)
                    else SyncResult(ErrorCode.not_coordinator),
                )
                for t, r in replies
            ]
        self._deliver(replies)
        self._wakeup.set()
        return ok

    @staticmethod
    def _deliver(replies: list[tuple[Any, Any]]) -> None:
        for token, result in replies:
            if isinstance(token, asyncio.Future) and not token.done():
                token.set_result(result)

    async def write(self, writes: list[Write], on_durable: Any = None) -> bool:
        """Append records to their partitions; True once all are durable. `on_durable` runs
        as soon as they are, before anything else can checkpoint the partitions."""
        return await self._finish_write(self._begin_write(writes), on_durable)

    def _begin_write(self, writes: list[Write]) -> _PendingWrite:
        """Start the appends now (synchronously), so the log order of records is the order
        in which the state machine produced them."""
        pending = _PendingWrite()
        for w in writes:
            pending.records.setdefault(w.partition, []).append((w.key, w.value))
        for index, records in pending.records.items():
            try:
                pending.tasks.extend(self._start_append(index, records))
            except LookupError as exc:
                log.warning("writing group records failed: %s", exc)
                pending.ok = False
            self._inflight[index] = self._inflight.get(index, 0) + 1
        return pending

    async def _finish_write(self, pending: _PendingWrite, on_durable: Any = None) -> bool:
        ok = pending.ok
        try:
            for result in await asyncio.gather(*pending.tasks, return_exceptions=True):
                if isinstance(result, BaseException):
                    log.warning("writing group records failed: %s", result)
                    ok = False
            if ok and on_durable is not None:
                on_durable()
        finally:
            for index, records in pending.records.items():
                self._inflight[index] -= 1
                if ok:
                    self._records_since_checkpoint[index] = self._records_since_checkpoint.get(index, 0) + len(records)
                    self._maybe_checkpoint(index)
        return ok

    def _start_append(self, index: int, records: list[tuple[bytes, bytes | None]]) -> list[asyncio.Task[Any]]:
        partition = self._partitions.get(index)
        if partition is None:
            raise LookupError(f"{OFFSETS_TOPIC}-{index} is not coordinated here")
        from automq.broker.kafka import records as batches

        loop = asyncio.get_running_loop()
        tasks = []
        for start in range(0, len(records), MAX_RECORDS_PER_BATCH):
            batch = bytearray(grouplog.encode_batch(records[start : start + MAX_RECORDS_PER_BATCH], now_ms()))
            tasks.append(loop.create_task(partition.append_batch(batch, batches.parse_header(batch))))
        return tasks

    # ---------------------------------------------------------------- compaction

    def _live_writes(self, index: int) -> list[Write]:
        out: list[Write] = []
        for g in self.manager.groups.values():
            if g.partition != index:
                continue
            if g.consumer is not None:
                out.append(self.manager.consumer_record(g))
            elif g.share is not None:
                out.append(self.manager.share_record(g))
            elif g.protocol_type or g.members or g.generation_id:
                out.append(g.record())
            for (t, p), o in g.offsets.items():
                out.append(
                    Write(
                        index,
                        grouplog.OffsetKey(g.group_id, t, p).encode(),
                        grouplog.OffsetValue(
                            o.offset, o.leader_epoch, o.metadata, o.commit_timestamp_ms, o.expire_timestamp_ms
                        ).encode(),
                    )
                )
        return out

    def _maybe_checkpoint(self, index: int) -> None:
        written = self._records_since_checkpoint.get(index, 0)
        if written < CHECKPOINT_MIN_RECORDS or index in self._checkpointing or self._txn_offsets.get(index):
            return  # (pending transactional offsets live only in the log: no trimming under them)
        live = sum(len(g.offsets) + 1 for g in self.manager.groups.values() if g.partition == index)
        if written < CHECKPOINT_FACTOR * live:
            return
        self._checkpointing.add(index)
        task = asyncio.get_running_loop().create_task(self._checkpoint(index))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _checkpoint(self, index: int) -> None:
        """Rewrite the live state and trim the log below it. Only when no other append is in
        flight: a commit reserved before the checkpoint but not yet applied would otherwise
        be trimmed away without being part of the checkpoint."""
        try:
            partition = self._partitions.get(index)
            if partition is None or self._inflight.get(index, 0):
                return
            start = partition.log_end_offset
            writes = self._live_writes(index)
            if writes and not await self.write(writes):
                return
            if self._partitions.get(index) is partition:
                await partition.stream.trim(start)
                self._records_since_checkpoint[index] = len(writes)
                log.info(
                    "%s-%d checkpointed: %d live records, log trimmed below %d",
                    OFFSETS_TOPIC,
                    index,
                    len(writes),
                    start,
                )
        except Exception:
            log.exception("checkpoint of %s-%d failed", OFFSETS_TOPIC, index)
        finally:
            self._checkpointing.discard(index)

    # ---------------------------------------------------------------- timers

    async def _run_timers(self) -> None:
        next_retention = now_ms() + RETENTION_CHECK_INTERVAL_MS
        while not self._closing:
            deadline = self.manager.next_deadline()
            wake_at = min(deadline, next_retention) if deadline is not None else next_retention
            delay = max(0.0, (wake_at - now_ms()) / 1000)
            self._wakeup.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
            if self._closing:
                return
            try:
                current = now_ms()
                self._apply_if_any(self.manager.tick(current))
                self._tell_share_listeners()
                if current >= next_retention:
                    next_retention = current + RETENTION_CHECK_INTERVAL_MS
                    self._apply_if_any(self.manager.expire_offsets(current))
            except Exception:
                log.exception("group coordinator timer failed")

    # ---------------------------------------------------------------- request-level operations

    async def join(self, **kwargs: Any) -> JoinResult:
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        fx = self.manager.join(now_ms(), token=fut, **kwargs)
        await self.apply(fx)
        return await fut

    async def sync(self, **kwargs: Any) -> SyncResult:
        fut: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        fx = self.manager.sync(now_ms(), token=fut, **kwargs)
        await self.apply(fx)
        return await fut

    def topic_view(self) -> TopicView:
        """The cluster's topics by name (id, partition count), rebuilt when the image changes."""
        image = self.broker.partitions.image
        if image is None:
            return {}
        if image is not self._view_image:
            self._view = {t.name: TopicMeta(topic_uuid(t.topic_id), len(t.partitions)) for t in image.topics}
            self._view_image = image
        return self._view

    async def consumer_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        """KIP-848: answer once the group's changed state (if any) is durable."""
        result, fx = self.manager.consumer_heartbeat(now_ms(), request)
        # an upgrade (online migration) also answers JoinGroup/SyncGroup requests waiting in the
        # classic group's rebalance (REBALANCE_IN_PROGRESS), once the change is durable
        if (fx.writes or fx.replies) and not await self._finish_apply(fx, self._begin_write(fx.writes)):
            return HeartbeatResult(ErrorCode.not_coordinator, "the group's state could not be written")
        return result

    async def share_heartbeat(self, request: ShareHeartbeatRequest) -> ShareHeartbeatResult:
        """KIP-932: answer once the group's changed state (if any) is durable."""
        result, fx = self.manager.share_heartbeat(now_ms(), request)
        if fx.writes:
            if not await self.write(fx.writes):
                return ShareHeartbeatResult(ErrorCode.not_coordinator, "the group's state could not be written")
            self._wakeup.set()  # new deadlines (sessions)
        self._tell_share_listeners()
        if fx.writes and result.error == ErrorCode.none:
            self._initialize_share_partitions(request.group_id)
        return result

    def _initialize_share_partitions(self, group_id: str) -> None:
        """Have the leaders create the group's state on partitions newly in its target assignment
        (Kafka's InitializeShareGroupState), in the background: with share.auto.offset.reset=latest
        a member then gets what was produced after the assignment, even before its first fetch."""
        if group_id in self._share_inits or not self.manager.share_uninitialized(group_id):
            return
        task = asyncio.get_running_loop().create_task(self._share_init(group_id))
        self._share_inits[group_id] = task
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._share_inits.get(group_id) is t:
                del self._share_inits[group_id]

        task.add_done_callback(done)

    async def _share_init(self, group_id: str) -> None:
        try:
            for _ in range(3):  # partitions that entered the target while this ran come next
                pending = sorted(self.manager.share_uninitialized(group_id), key=lambda tp: (str(tp[0]), tp[1]))
                names = names_by_id(self.topic_view())
                pending = [(t, p) for t, p in pending if t in names]
                if not pending or self._closing:
                    return
                results = await asyncio.gather(
                    *(self.share_state.initialize(group_id, names[t], p) for t, p in pending)
                )
                done = [tp for tp, error in zip(pending, results, strict=True) if error == ErrorCode.none]
                if not done:
                    return  # leaders unavailable: the next change of the group tries again
                fx = self.manager.share_mark_initialized(group_id, done, now_ms())
                if fx.writes:
                    await self.write(fx.writes)
        except Exception:
            log.exception("initializing share-partitions of group %r failed", group_id)

    def _group_int(self, group_id: str, key: str, default: int) -> int:
        value = group_configs.configs_of(self.broker.metadata, group_id).get(key)
        return int(value) if value is not None else default

    def group_config(self, group_id: str) -> dict[str, str]:
        """Every group config key with the value that applies to `group_id` (group_configs.py)."""
        return group_configs.effective_group_config(
            group_configs.configs_of(self.broker.metadata, group_id), self.broker.config
        )

    def share_member(self, group_id: str, member_id: str) -> bool | None:
        """For the partition side: whether `member_id` is in share group `group_id`, or None when
        this broker does not coordinate the group (then nothing is known here)."""
        if self.coordinator_error(group_id) is not None:
            return None
        return self.manager.share_member(group_id, member_id)

    def add_share_listener(self, listener: Callable[[str, str], None]) -> None:
        """`listener(group_id, member_id)` runs when a share-group member coordinated here leaves
        or is fenced, so the partition side can release what it holds without waiting for locks
        to time out."""
        self._share_listeners.append(listener)

    def _tell_share_listeners(self) -> None:
        departed, self.manager.share_departed = self.manager.share_departed, []
        for group_id, member_id in departed:
            for listener in self._share_listeners:
                try:
                    listener(group_id, member_id)
                except Exception:
                    log.exception("share group listener failed for %s/%s", group_id, member_id)

    def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int) -> ErrorCode:
        # No timer wake-up: a heartbeat only moves a deadline later, and waking the timer
        # (a scan of every group) on each heartbeat would cost O(members) per heartbeat. The
        # exception: a classic member of a KIP-848 group told to rejoin gets a new, earlier
        # deadline (its rebalance timeout), once per rebalance.
        error = self.manager.heartbeat(now_ms(), group_id, member_id, group_instance_id, generation_id)
        if self.manager.deadline_added:
            self.manager.deadline_added = False
            self._wakeup.set()
        return error

    async def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        top, errors, fx = self.manager.leave(now_ms(), group_id, members)
        await self.apply(fx)
        return top, errors

    async def commit(self, plan: CommitPlan) -> dict[tuple[str, int], ErrorCode]:
        """Make an accepted commit durable, then visible. Errors per partition."""
        if not plan.writes:
            return plan.errors

        def durable() -> None:
            self.manager.complete_commit(plan, now_ms())
            self.metrics.commits += len(plan.accepted)

        if not await self.write(plan.writes, on_durable=durable):
            return {k: (ErrorCode.not_coordinator if v == ErrorCode.none else v) for k, v in plan.errors.items()}
        return plan.errors

    # ---------------------------------------------------------------- transactional offsets

    async def txn_commit(
        self,
        *,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[tuple[str, int, int, int, str | None]],
        verification_guard: object | None = None,
    ) -> dict[tuple[str, int], ErrorCode]:
        """TxnOffsetCommit: validate (KIP-447: the member and generation when given), write
        the offsets as the producer's transactional batch, hold them until its marker.
        `verification_guard`: the transaction coordinator confirmed the partition (KIP-890)."""
        now = now_ms()
        existing = self.manager.groups.get(group_id)
        if existing is not None and existing.share is not None:
            return {(t, p): ErrorCode.group_id_not_found for t, p, *_ in offsets}  # no offsets in a share group
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group_id not in self.manager.groups:
                return {(t, p): ErrorCode.illegal_generation for t, p, *_ in offsets}
            plan = self.manager.prepare_commit(
                now,
                group_id=group_id,
                generation_id=generation_id,
                member_id=member_id,
                group_instance_id=group_instance_id,
                offsets=offsets,
            )
        elif not group_id:
            return {(t, p): ErrorCode.invalid_group_id for t, p, *_ in offsets}
        else:
            # no member information (TxnOffsetCommit v0-v2): any producer may commit, as in Kafka
            plan = CommitPlan(group_id, {}, {}, [])
            index = self.partition_for(group_id)
            for topic, partition, offset, leader_epoch, metadata in offsets:
                meta = metadata or ""
                if len(meta.encode()) > OFFSET_METADATA_MAX_BYTES:
                    plan.errors[(topic, partition)] = ErrorCode.offset_metadata_too_large
                    continue
                plan.errors[(topic, partition)] = ErrorCode.none
                plan.accepted[(topic, partition)] = CommittedOffset(offset, leader_epoch, meta, now)
                plan.writes.append(
                    Write(
                        index,
                        grouplog.OffsetKey(group_id, topic, partition).encode(),
                        grouplog.OffsetValue(offset, leader_epoch, meta, now).encode(),
                    )
                )
        if not plan.writes:
            return plan.errors
        index = plan.writes[0].partition
        led = self._partitions.get(index)
        if led is None:
            return dict.fromkeys(plan.errors, ErrorCode.not_coordinator)
        batch = bytearray(
            grouplog.encode_batch(
                [(w.key, w.value) for w in plan.writes], now, producer_id=producer_id, producer_epoch=producer_epoch
            )
        )
        self._inflight[index] = self._inflight.get(index, 0) + 1
        try:
            await led.append_batch(
                batch, batches.parse_header(batch), sequenced=False, verification_guard=verification_guard
            )
        except ProducerStateError as exc:  # the transaction ended while it was verified
            return {k: (exc.error_code if v == ErrorCode.none else v) for k, v in plan.errors.items()}
        except Exception as exc:
            log.warning("writing transactional offsets of %r failed: %r", group_id, exc)
            return {k: (ErrorCode.not_coordinator if v == ErrorCode.none else v) for k, v in plan.errors.items()}
        finally:
            self._inflight[index] -= 1
        if self._partitions.get(index) is led:
            by_group = self._txn_offsets.setdefault(index, {}).setdefault(producer_id, {})
            by_group.setdefault(group_id, {}).update(plan.accepted)
        return plan.errors

    def complete_txn_offsets(self, index: int, producer_id: int, commit: bool) -> None:
        """A marker of `producer_id` is durable in partition `index`."""
        pending = self._txn_offsets.get(index)
        if not pending:
            return
        groups = pending.pop(producer_id, None)
        if not pending:
            del self._txn_offsets[index]
        if not commit or not groups:
            return
        now = now_ms()
        for group_id, offsets in groups.items():
            self.manager.complete_commit(CommitPlan(group_id, {}, offsets, []), now)
            self.metrics.commits += len(offsets)

    def has_pending_txn_offset(self, group_id: str, topic: str, partition: int) -> bool:
        pending = self._txn_offsets.get(self.partition_for(group_id))
        if not pending:
            return False
        return any((topic, partition) in groups.get(group_id, {}) for groups in pending.values())

    async def delete_group(self, group_id: str) -> ErrorCode:
        group = self.manager.groups.get(group_id)
        if group is not None and group.share is not None and not group.share.members:
            # a share group's state on its partitions goes first: a group created later with
            # the same id must not resume where this one stopped
            error = await self.share_state.delete_all(group_id)
            if error != ErrorCode.none:
                return ErrorCode.coordinator_not_available if error == ErrorCode.not_leader_or_follower else error
        error, fx = self.manager.delete_group(group_id, now_ms())
        if fx.writes and not await self.write(fx.writes):
            return ErrorCode.not_coordinator
        return error

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        top, errors, fx = self.manager.delete_offsets(group_id, partitions)
        if fx.writes and not await self.write(fx.writes):
            return ErrorCode.not_coordinator, {}
        return top, errors
