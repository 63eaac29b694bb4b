"""Share-partitions this broker leads (KIP-932): one per (share group, led partition).

A SharePartition is created on the first ShareFetch of a group for a partition led here:
it loads the durable state (state_store.py) or starts at the group's share.auto.offset.reset
position, and claims the state object under this leader's epoch (fencing a deposed leader).
From then on:

- acquisitions are in memory only: a lock does not survive its leader (Kafka does the same),
- every acknowledgement, release and lock expiry is persisted before it is answered, with
  group commit: while one write is in flight, later changes wait and go out together,
- lock expiry is one timer per share-partition, set at the earliest deadline,
- ShareFetch long polls wait on the partition's appends and on the share-partition's own
  waiters (woken when records become available again).

When the partition leaves this broker (move, shutdown) the state is written one last time
and dropped; the next leader loads it. After a crash the next leader loads what was last
written: records locked at the time become available again, nothing acknowledged returns.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from automq.broker.kafka.groups.share_settings import ShareGroupSettings, share_settings
from automq.broker.kafka.partitions import NotLeaderError, Partition
from automq.broker.kafka.share.metrics import ShareMetrics
from automq.broker.kafka.share.partition_state import ACQUIRED, SharePartitionState
from automq.broker.kafka.share.state_store import ShareStateSnapshot, ShareStateStore
from automq.broker.objectstore import PreconditionFailed

if TYPE_CHECKING:
    from automq.broker.kafka.broker import Broker

log = logging.getLogger(__name__)


OPEN_WAIT_S = 5.0
SWEEP_INTERVAL_S = 60.0
IDLE_UNLOAD_S = 600.0  # a share-partition unused this long is unloaded (its state stays durable)

SettingsSource = Callable[["Broker", str], ShareGroupSettings]


class ShareStateFenced(Exception):
    """Another leader wrote this share-partition's state: this broker must stop serving it."""


_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration_ms(text: str) -> int:
    """ISO-8601 durations as share.auto.offset.reset by_duration takes them (PnDTnHnMnS)."""
    m = _DURATION.match(text.strip().upper())
    if m is None or not any(m.groups()):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    return int((((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000)


class SharePartition:
    """One share group's view of one led partition."""

    def __init__(
        self,
        group_id: str,
        partition: Partition,
        state: SharePartitionState,
        store: ShareStateStore,
        etag: str | None,
        write_seq: int,
        settings: ShareGroupSettings,
        metrics: ShareMetrics,
    ) -> None:
        self.group_id = group_id
        self.metrics = metrics
        self.partition = partition
        self.state = state
        self.settings = settings
        self._store = store
        self._etag = etag
        self._seq = write_seq
        self.last_used = time.monotonic()
        self.version = 1  # bumped by every change that must be durable
        self.persisted = 0
        self.fenced = False
        self.closed = False
        self._writing: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._waiters: set[asyncio.Future[None]] = set()

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.group_id, self.partition.topic, self.partition.partition)

    # ---------------------------------------------------------------- durability

    def changed(self) -> None:
        self.version += 1

    async def persist(self) -> None:
        """Return once every change made before the call is durable (group commit).
        Raises ShareStateFenced if another leader took the state over."""
        target = self.version
        while self.persisted < target:
            if self.fenced:
                raise ShareStateFenced(f"share state of {self.key} was taken over by another leader")
            if self._writing is None:
                self._writing = asyncio.get_running_loop().create_task(self._write_once())
            task = self._writing
            try:
                await asyncio.shield(task)
            finally:
                if self._writing is task and task.done():
                    self._writing = None

    async def _write_once(self) -> None:
        version = self.version
        self._seq += 1
        snapshot = ShareStateSnapshot(
            self.group_id,
            self.partition.stream.stream_id,
            self.state.start_offset,
            self.state.durable_ranges(),
            leader_epoch=self.partition.leader_epoch,
            write_seq=self._seq,
        )
        started = time.perf_counter()
        try:
            self._etag = await self._store.write(snapshot, self._etag)
        except PreconditionFailed:
            self.metrics.state_write_failures.inc()
            self.fenced = True
            self.wake()
            raise ShareStateFenced(f"share state of {self.key} was written by another leader") from None
        except Exception:
            self.metrics.state_write_failures.inc()
            raise
        self.metrics.state_write_seconds.observe(time.perf_counter() - started)
        self.persisted = max(self.persisted, version)

    # ---------------------------------------------------------------- locks and waiters

    def schedule_expiry(self) -> None:
        deadline = self.state.next_deadline()
        if deadline is None or self.closed:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(deadline - _now_ms(), 0) / 1000
        self._timer_at = deadline
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        unlocked = self.state.expire(_now_ms(), self.settings.delivery_count_limit)
        if unlocked:
            self.metrics.lock_expired.inc(unlocked)
            self.changed()
            self.persist_in_background()
            self.wake()
        self.schedule_expiry()

    def persist_in_background(self) -> None:
        task = asyncio.get_running_loop().create_task(self.persist())
        task.add_done_callback(_log_failure)

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def wake(self) -> None:
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
        self._waiters.clear()

    def release_member(self, member_id: str) -> int:
        released = self.state.release_member(member_id, self.settings.delivery_count_limit)
        if released:
            self.metrics.released.inc(released)
            self.changed()
            self.persist_in_background()
            self.wake()
        return released

    @property
    def idle(self) -> bool:
        """Nothing held, nobody waiting, nothing unwritten: can be unloaded."""
        return (
            not self._waiters
            and self.persisted >= self.version
            and self._writing is None
            and not any(r.state == ACQUIRED for r in self.state.ranges)
        )

    async def close(self) -> None:
        """Last write before the partition leaves (locks are released by not storing them,
        the deliveries counted so far are kept)."""
        if self.closed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.fenced:
            try:
                self.changed()
                await self.persist()
            except Exception as exc:
                log.warning("final write of share state %s failed: %s", self.key, exc)
        self.closed = True
        self.wake()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("persisting share state failed: %s", exc)


def _now_ms() -> int:
    return int(time.time() * 1000)


class SharePartitionManager:
    """The broker's share-partitions, created on demand and dropped with their partition.
    Registered as a PartitionListener: resignation writes the state one last time."""

    def __init__(self, broker: Broker, settings: SettingsSource = share_settings) -> None:
        self._broker = broker
        self._settings = settings
        # None: a broker without storage (protocol-only tests), which leads no partition
        storage = broker.storage
        self._store = ShareStateStore(storage.object_store) if storage is not None else None
        self._shares: dict[tuple[str, str, int], SharePartition] = {}
        self._loading: dict[tuple[str, str, int], asyncio.Task[SharePartition]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        broker.partitions.add_listener(self)
        self.metrics = ShareMetrics(
            broker.registry,
            in_flight=lambda: float(sum(s.state.in_flight for s in self._shares.values())),
            loaded=lambda: float(len(self._shares)),
        )
        # Not released when the coordinator sees a member leave: librdkafka leaves the group
        # (ShareGroupHeartbeat epoch -1) *before* its closing ShareAcknowledge, whose
        # acceptances would then find the records released (and redelivered). A member's
        # records go back when its share session closes, is evicted, or its locks expire.

    @property
    def store(self) -> ShareStateStore:
        if self._store is None:
            raise NotLeaderError("this broker has no storage")
        return self._store

    def settings(self, group_id: str) -> ShareGroupSettings:
        return self._settings(self._broker, group_id)

    def shares(self) -> list[SharePartition]:
        return list(self._shares.values())

    async def get(self, group_id: str, topic: str, index: int) -> SharePartition:
        """The share-partition, loaded on first use. Raises NotLeaderError /
        UnknownPartitionError when the partition is not led here."""
        # a partition just placed here (created, moved) is waited for briefly, as Produce does
        partition = await self._broker.partitions.get_when_open(topic, index, OPEN_WAIT_S)
        key = (group_id, topic, index)
        share = self._shares.get(key)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="share-partition-sweeper")
        if share is not None and share.partition is partition and not share.fenced and not share.closed:
            share.settings = self.settings(group_id)
            share.last_used = time.monotonic()
            return share
        if share is not None:
            self._shares.pop(key, None)
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(group_id, partition))
            self._loading[key] = task
            task.add_done_callback(lambda _t: self._loading.pop(key, None))
        return await asyncio.shield(task)

    async def _load(self, group_id: str, partition: Partition) -> SharePartition:
        settings = self.settings(group_id)
        loaded = await self.store.load(group_id, partition.stream.stream_id)
        if loaded is not None:
            snapshot, etag = loaded
            if snapshot.leader_epoch > partition.leader_epoch:
                raise NotLeaderError(
                    f"share state of {partition.topic}-{partition.partition} was written under leader epoch "
                    f"{snapshot.leader_epoch} > ours ({partition.leader_epoch})"
                )
            state = SharePartitionState.restore(snapshot.start_offset, snapshot.ranges)
            seq = snapshot.write_seq
        else:
            state = SharePartitionState(await self._initial_offset(partition, settings))
            etag, seq = None, 0
        if state.start_offset < partition.log_start_offset:
            state.move_start(partition.log_start_offset)
        share = SharePartition(group_id, partition, state, self.store, etag, seq, settings, self.metrics)
        # claim: rewrite under our epoch now, so a deposed leader's next write is refused
        try:
            await share.persist()
        except ShareStateFenced:
            raise NotLeaderError(
                f"share state of {partition.topic}-{partition.partition} is written elsewhere"
            ) from None
        if partition.closed:
            raise NotLeaderError(f"{partition.topic}-{partition.partition} is no longer led here")
        self._shares[share.key] = share
        log.info(
            "share group %s on %s-%d: start offset %d, %d records in flight",
            group_id,
            partition.topic,
            partition.partition,
            state.start_offset,
            state.in_flight,
        )
        return share

    async def _initial_offset(self, partition: Partition, settings: ShareGroupSettings) -> int:
        reset = settings.auto_offset_reset
        if reset == "earliest":
            return partition.log_start_offset
        if reset.startswith("by_duration:"):
            since = _now_ms() - parse_duration_ms(reset.split(":", 1)[1])
            found = await partition.offset_for_timestamp(since)
            return found[0] if found is not None else partition.high_watermark
        return partition.high_watermark

    async def _sweep(self) -> None:
        """Unload share-partitions nobody used for IDLE_UNLOAD_S (a group that stopped
        consuming): their state is in the object store, the next ShareFetch loads it again."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self.unload_idle(time.monotonic() - IDLE_UNLOAD_S)

    def unload_idle(self, used_before: float) -> int:
        idle = [s for s in self._shares.values() if s.last_used < used_before and s.idle]
        for share in idle:
            self._shares.pop(share.key, None)
            share.fenced = True  # nothing unwritten (idle): no final write
            share.closed = True
            if share._timer is not None:
                share._timer.cancel()
        return len(idle)

    # ---------------------------------------------------------------- members

    def release_member(self, group_id: str, member_id: str, keys: list[tuple[str, int]] | None = None) -> int:
        """Release what a member holds (its share session closed, or it left the group)."""
        released = 0
        for share in list(self._shares.values()):
            if share.group_id != group_id:
                continue
            if keys is not None and (share.partition.topic, share.partition.partition) not in keys:
                continue
            released += share.release_member(member_id)
        return released

    # ---------------------------------------------------------------- PartitionListener

    async def on_elected(self, partition: Partition) -> None:
        """Nothing: share-partitions load on their group's first ShareFetch."""

    async def on_resigned(self, topic: str, partition: int) -> None:
        shares = [s for s in self._shares.values() if s.partition.topic == topic and s.partition.partition == partition]
        for share in shares:
            self._shares.pop(share.key, None)
        if not shares:
            return
        info = self._broker.partitions.topic(topic)
        if info is None or all(p.stream_id != shares[0].partition.stream.stream_id for p in info.partitions):
            # the topic was deleted (its stream with it): its share state goes too
            for share in shares:
                share.fenced = True  # no final write
                await share.close()
                try:
                    await self.store.delete(share.group_id, share.partition.stream.stream_id)
                except Exception as exc:
                    log.warning(
                        "deleting share state of %s on deleted %s-%d failed: %s", share.group_id, topic, partition, exc
                    )
            return
        await asyncio.gather(*(s.close() for s in shares))

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        shares = list(self._shares.values())
        self._shares.clear()
        if shares:
            await asyncio.gather(*(s.close() for s in shares), return_exceptions=True)

    # ---------------------------------------------------------------- admin (group side)

    async def summary(self, group_id: str, topic: str, index: int) -> tuple[int, int] | None:
        """(share-partition start offset, leader epoch), or None when the group has no
        state for the partition. Raises NotLeaderError when not led here."""
        partition = self._broker.partitions.get(topic, index)
        share = self._shares.get((group_id, topic, index))
        if share is not None and share.partition is partition and not share.closed:
            return share.state.start_offset, partition.leader_epoch
        loaded = await self.store.load(group_id, partition.stream.stream_id)
        if loaded is None:
            return None
        return loaded[0].start_offset, partition.leader_epoch

    async def initialize(self, group_id: str, topic: str, index: int) -> int:
        """Create the share-partition now (start offset from share.auto.offset.reset, durable)
        unless it exists; returns its start offset. For the group side, when it first assigns
        the partition: with `latest`, records produced between the assignment and the first
        ShareFetch are then delivered too. Raises NotLeaderError when not led here."""
        return (await self.get(group_id, topic, index)).state.start_offset

    async def reset(self, group_id: str, topic: str, index: int, start_offset: int) -> None:
        """AlterShareGroupOffsets (the group side checks the group is empty): drop in-flight
        state and start at `start_offset`, durably."""
        share = await self.get(group_id, topic, index)
        share.state = SharePartitionState(max(start_offset, share.partition.log_start_offset))
        share.changed()
        await share.persist()
        share.wake()

    async def delete(self, group_id: str, topic: str, index: int) -> None:
        """DeleteShareGroupOffsets / DeleteGroups: the state goes; a later ShareFetch starts
        from share.auto.offset.reset."""
        partition = self._broker.partitions.get(topic, index)
        share = self._shares.pop((group_id, topic, index), None)
        if share is not None:
            share.fenced = True  # no final write
            await share.close()
        await self.store.delete(group_id, partition.stream.stream_id)

    def in_flight_counts(self, group_id: str) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (start offset, records in flight), for describe."""
        return {
            (s.partition.topic, s.partition.partition): (s.state.start_offset, s.state.in_flight)
            for s in self._shares.values()
            if s.group_id == group_id
        }
