"""Partitions this broker leads: following the controller's metadata, opening and closing streams.

`PartitionManager` long-polls `cluster.watch_metadata`, and for every partition placed on this
node (leader == node_id, not `moving`) opens its stream with stream epoch = leader epoch, which
fences any previous owner at the storage layer, and rebuilds its producer state before serving
it. Partitions that moved away, are `moving` or were deleted are closed (flush + upload); for a
`moving` partition the controller is told with `partition_closed` so it can hand the partition
to its target. Listeners (the group and transaction coordinators) hear of every election and
resignation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Protocol

from automq.broker.config import NodeConfig
from automq.broker.controller.protocol import ClusterClient, MetadataImage, PartitionInfo, TopicInfo
from automq.broker.kafka import producer_recovery
from automq.broker.kafka.metrics import KafkaMetrics
from automq.broker.kafka.partitions import NotLeaderError, Partition, UnknownPartitionError
from automq.broker.kafka.producer_snapshots import ProducerSnapshotStore
from automq.broker.kafka.producers import ProducerStateManager
from automq.broker.storage.api import StreamClient, StreamClosedError
from automq.broker.storage.metadata import NodeFencedError, StreamFencedError, StreamNotFoundError

log = logging.getLogger(__name__)


class PartitionHost(Protocol):
    """What the partitions need from the broker that owns them (the Broker implements it; a
    protocol here, so this module does not import the broker module that imports it)."""

    config: NodeConfig
    node_id: int
    node_epoch: int
    cluster: ClusterClient
    storage: StreamClient
    metrics: KafkaMetrics

    def _on_metadata(self, image: MetadataImage) -> None: ...


class PartitionListener(Protocol):
    async def on_elected(self, partition: Partition) -> None: ...

    async def on_resigned(self, topic: str, partition: int) -> None: ...


def _new_producer_state(expiration_ms: int) -> ProducerStateManager:
    return ProducerStateManager(producer_id_expiration_ms=expiration_ms)


class PartitionManager:
    """Follows controller metadata; owns the Partition objects this broker leads."""

    WATCH_TIMEOUT_MS = 30_000
    CLOSE_TIMEOUT_S = 60.0

    def __init__(self, broker: PartitionHost) -> None:
        self._broker = broker
        # producer snapshots live in the object store the streams use (None: a broker
        # without storage, in protocol-only tests)
        storage = broker.storage
        self._snapshots = ProducerSnapshotStore(storage.object_store) if storage is not None else None
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._transitions: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._listeners: list[PartitionListener] = []
        self._image: MetadataImage | None = None
        self._topics: dict[str, TopicInfo] = {}
        self._topics_by_id: dict[str, TopicInfo] = {}
        self._image_changed = asyncio.Event()
        self._opened = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._expiry_task: asyncio.Task[None] | None = None
        self._closing = False

    # ---------------------------------------------------------------- queries

    @property
    def image(self) -> MetadataImage | None:
        return self._image

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: str | uuid.UUID | None) -> TopicInfo | None:
        """The topic with this id, as a request names it (a UUID; None when a request left it
        out): None when this broker's image does not know it."""
        return None if topic_id is None else self._topics_by_id.get(str(topic_id))

    def get(self, topic: str, partition: int) -> Partition:
        p = self._partitions.get((topic, partition))
        if p is not None and not p.closed:
            return p
        info = self._topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            raise UnknownPartitionError(f"unknown partition {topic}-{partition}")
        raise NotLeaderError(f"{topic}-{partition} is not led by node {self._broker.node_id}")

    async def get_when_open(self, topic: str, partition: int, timeout: float) -> Partition:
        """`get`, except that a partition this broker's image places here whose open is still
        in flight (just created or moved here) is waited for, up to `timeout`, instead of
        answering NOT_LEADER_OR_FOLLOWER to a client that already has the new metadata."""
        try:
            return self.get(topic, partition)
        except NotLeaderError:
            task = self._transitions.get((topic, partition))
            info = self._topics.get(topic)
            placed = info is not None and 0 <= partition < len(info.partitions)
            if task is None or not placed:
                raise
            assert info is not None
            p = info.partitions[partition]
            if p.leader != self._broker.node_id or p.state != "online":
                raise
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except Exception:  # timed out, or the open failed: answered just below
                pass
            return self.get(topic, partition)

    def led(self) -> list[Partition]:
        return [p for p in self._partitions.values() if not p.closed]

    def add_listener(self, listener: PartitionListener) -> None:
        self._listeners.append(listener)
        # a listener added late still hears about partitions already open
        for p in self.led():
            asyncio.get_running_loop().create_task(self._notify_elected(listener, p))

    async def wait_opened(self, topic: str, timeout: float) -> bool:
        """Wait until every partition of `topic` placed on this broker is open here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            info = self._topics.get(topic)
            mine = (
                [p.partition for p in info.partitions if p.leader == self._broker.node_id] if info is not None else []
            )
            if info is not None and all((topic, i) in self._partitions for i in mine):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._opened.clear()
            try:
                await asyncio.wait_for(self._opened.wait(), remaining)
            except TimeoutError:
                pass

    async def wait_for_image(self, predicate, timeout: float) -> MetadataImage | None:
        """Wait until the current image satisfies predicate(image) or timeout; returns it."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self._image is not None and predicate(self._image):
                return self._image
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return self._image
            self._image_changed.clear()
            try:
                await asyncio.wait_for(self._image_changed.wait(), remaining)
            except TimeoutError:
                pass

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._watch_task = asyncio.get_running_loop().create_task(self._follow(), name="partition-manager-watch")
        self._expiry_task = asyncio.get_running_loop().create_task(self._expire_producers(), name="producer-expiry")

    async def _expire_producers(self) -> None:
        interval_s = self._broker.config.kafka.producer_id_expiration_check_interval_ms / 1000
        while not self._closing:
            await asyncio.sleep(interval_s)
            dropped = producer_recovery.expire_producers(self.led(), int(time.time() * 1000))
            if dropped:
                log.info("forgot %d producers idle for producer.id.expiration.ms", dropped)

    async def _follow(self) -> None:
        cluster = self._broker.cluster
        since = -1
        backoff = 0.1
        while not self._closing:
            try:
                image = await cluster.watch_metadata(since, self.WATCH_TIMEOUT_MS, self._broker.node_id)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watch_metadata failed (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if image.version > since or self._image is None:
                since = image.version
                self.apply(image)

    def apply(self, image: MetadataImage) -> None:
        """Take a new image: index it and start opening/closing partitions (tasks)."""
        self._image = image
        self._topics = {t.name: t for t in image.topics}
        self._topics_by_id = {t.topic_id: t for t in image.topics}
        self._broker._on_metadata(image)
        self._image_changed.set()
        if self._closing:
            return
        node = self._broker.node_id
        desired: dict[tuple[str, int], tuple[PartitionInfo, TopicInfo]] = {}
        for t in image.topics:
            for p in t.partitions:
                if p.leader == node and p.state == "online":
                    desired[(t.name, p.partition)] = (p, t)
        for key, led in list(self._partitions.items()):
            want = desired.get(key)
            if want is None or want[0].leader_epoch != led.leader_epoch or led.closed:
                moving_info = self._moving_info(image, key)
                self._schedule(key, self._close_partition(led, moving_info))
            else:
                led.configs = dict(want[1].configs)  # config changes (LogAppendTime, max.message.bytes)
                if want[0].compacted_end:
                    # Key compaction rewrote a range this leader may still hold cached.
                    led.stream.invalidate_cached_below(want[0].compacted_end)
        for key, (info, topic) in desired.items():
            current = self._partitions.get(key)
            if current is None or current.leader_epoch != info.leader_epoch:
                self._schedule(key, self._open_partition(info, topic))
        # a moving partition we never opened (or already closed) still needs its ack; one whose
        # open (started from an older image) is still running is closed once that open is done,
        # or the open would finish after this image and lead it for good (a stranded move)
        for t in image.topics:
            for p in t.partitions:
                key = (t.name, p.partition)
                if p.state == "moving" and p.leader == node and key not in self._partitions:
                    if key in self._transitions:
                        self._schedule(key, self._settle_moving(key, p))
                    else:
                        self._schedule(key, self._ack_closed(p))

    @staticmethod
    def _moving_info(image: MetadataImage, key: tuple[str, int]) -> PartitionInfo | None:
        for t in image.topics:
            if t.name == key[0]:
                for p in t.partitions:
                    if p.partition == key[1] and p.state == "moving":
                        return p
        return None

    def _schedule(self, key: tuple[str, int], step) -> None:
        """Run open/close steps of one partition one after another, in image order."""
        previous = self._transitions.get(key)

        async def run() -> None:
            if previous is not None:
                # whatever the previous step ended with; but a cancel of this step (shutdown)
                # must stop it here, not run its step (an open would retry for good)
                await asyncio.wait({previous})
            try:
                await step
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("partition transition of %s-%d failed", *key)
            finally:
                if self._transitions.get(key) is task:
                    del self._transitions[key]

        task = asyncio.get_running_loop().create_task(run(), name=f"partition-{key[0]}-{key[1]}")
        self._transitions[key] = task

    async def _open_partition(self, info: PartitionInfo, topic: TopicInfo) -> None:
        key = (info.topic, info.partition)
        current = self._partitions.get(key)
        if current is not None:
            if current.leader_epoch == info.leader_epoch and not current.closed:
                return
            await self._close_partition(current, None)
        backoff = 0.1
        while True:
            # the image may have moved on while we waited (earlier transitions, retries)
            if not self._still_placed_here(info):
                return
            try:
                stream = await self._broker.storage.open_stream(info.stream_id, info.leader_epoch)
                break
            except StreamFencedError:
                log.warning(
                    "stream of %s-%d is owned under a newer epoch than %d; waiting for metadata",
                    info.topic,
                    info.partition,
                    info.leader_epoch,
                )
                return
            except Exception as exc:
                # a controller or object-store blip must not leave the partition unserved until
                # the next metadata change: retry while it is still ours
                log.warning("opening %s-%d failed (%s); retrying in %.1fs", info.topic, info.partition, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        partition = Partition(
            info,
            topic,
            stream,
            _new_producer_state(self._broker.config.kafka.producer_id_expiration_ms),
            self,
            self._snapshots,
        )
        backoff = 0.1
        while True:
            # Serving without the producer state would append retried batches twice: wait for
            # the object store instead, while the partition is still ours.
            try:
                await partition.rebuild_producer_state()
                break
            except StreamClosedError:
                log.warning("stream of %s-%d was fenced while its producer state was rebuilt", *key)
                return
            except Exception as exc:
                if not self._still_placed_here(info):
                    await partition.close()
                    return
                log.warning(
                    "rebuilding producer state of %s-%d failed (%s); retrying in %.1fs",
                    info.topic,
                    info.partition,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        self._partitions[key] = partition
        self._opened.set()
        self._broker.metrics.partitions.set(len(self._partitions))
        self._broker.metrics.partition_opened(*key)
        log.info(
            "leading %s-%d (stream %d, epoch %d, offsets %d..%d)",
            info.topic,
            info.partition,
            info.stream_id,
            info.leader_epoch,
            stream.start_offset,
            stream.end_offset,
        )
        for listener in list(self._listeners):
            await self._notify_elected(listener, partition)

    def _still_placed_here(self, info: PartitionInfo) -> bool:
        latest = self._topics.get(info.topic)
        if latest is None or self._closing:
            return False
        p = next((p for p in latest.partitions if p.partition == info.partition), None)
        return (
            p is not None
            and p.leader == self._broker.node_id
            and p.leader_epoch == info.leader_epoch
            and p.state == "online"
        )

    async def _notify_elected(self, listener: PartitionListener, partition: Partition) -> None:
        try:
            await listener.on_elected(partition)
        except Exception:
            log.exception("listener %r failed on election of %s-%d", listener, partition.topic, partition.partition)

    async def _close_partition(self, partition: Partition, moving: PartitionInfo | None) -> None:
        key = (partition.topic, partition.partition)
        if self._partitions.get(key) is partition:
            del self._partitions[key]
            self._broker.metrics.partitions.set(len(self._partitions))
            self._broker.metrics.partition_closed(*key)
        for listener in list(self._listeners):
            try:
                await listener.on_resigned(partition.topic, partition.partition)
            except Exception:
                log.exception("listener %r failed on resignation of %s-%d", listener, *key)
        try:
            await partition.close()
        except StreamNotFoundError:
            # The topic was deleted: the controller dropped the stream with it, so there is
            # nothing left to flush or release. Expected, not an error.
            log.info("stream of %s-%d is gone (topic deleted)", *key)
            if self._snapshots is not None:
                try:
                    await self._snapshots.delete_all(partition.stream.stream_id)
                except Exception as exc:
                    log.warning("deleting producer snapshots of deleted %s-%d failed: %s", *key, exc)
        except Exception:
            log.exception("closing stream of %s-%d failed", *key)
        log.info("resigned %s-%d (epoch %d)", partition.topic, partition.partition, partition.leader_epoch)
        if moving is not None:
            await self._ack_closed(moving)

    async def _settle_moving(self, key: tuple[str, int], moving: PartitionInfo) -> None:
        """After the transitions scheduled before a move (an open in flight): hand over
        whatever they left led here."""
        led = self._partitions.get(key)
        if led is not None:
            await self._close_partition(led, moving)
        else:
            await self._ack_closed(moving)

    async def _ack_closed(self, info: PartitionInfo) -> None:
        """Hand a moving partition over: release its stream (upload what is left, close it at
        the controller, which completes the move in the same step) and confirm with
        partition_closed. Retried until it goes through or the metadata moved on: a move must
        never wait for a controller or object-store blip to be noticed again."""
        b = self._broker
        backoff = 0.1
        while not self._closing and self._still_moving_from_here(info):
            try:
                await b.storage.release_stream(info.stream_id, info.leader_epoch)
                await b.cluster.partition_closed(info.topic, info.partition, b.node_id, b.node_epoch, info.leader_epoch)
                return
            except (NodeFencedError, StreamClosedError) as exc:
                # this node was fenced: the controller moves its partitions without it
                log.warning("cannot hand over %s-%d: %s", info.topic, info.partition, exc)
                return
            except Exception as exc:
                log.warning(
                    "handing over %s-%d failed (%s); retrying in %.1fs", info.topic, info.partition, exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _still_moving_from_here(self, info: PartitionInfo) -> bool:
        latest = self._topics.get(info.topic)
        p = next((p for p in latest.partitions if p.partition == info.partition), None) if latest else None
        return (
            p is not None
            and p.state == "moving"
            and p.leader == self._broker.node_id
            and p.leader_epoch == info.leader_epoch
        )

    def _drop_fenced(self, partition: Partition) -> None:
        key = (partition.topic, partition.partition)
        partition.closed = True
        if self._partitions.get(key) is partition:
            self._schedule(key, self._close_partition(partition, None))

    async def close(self) -> None:
        """Graceful: stop following metadata, close every led partition (flush + upload)."""
        self._closing = True
        for task in (self._watch_task, self._expiry_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        transitions = list(self._transitions.values())
        if transitions:
            _done, pending = await asyncio.wait(transitions, timeout=self.CLOSE_TIMEOUT_S)
            for task in pending:  # an open stuck on storage must not block shutdown forever
                task.cancel()
        closing = [asyncio.ensure_future(self._close_partition(p, None)) for p in list(self._partitions.values())]
        if closing:
            _done, pending = await asyncio.wait(closing, timeout=self.CLOSE_TIMEOUT_S)
            for task in pending:
                log.error("closing a partition did not finish within %.0fs", self.CLOSE_TIMEOUT_S)
                task.cancel()
