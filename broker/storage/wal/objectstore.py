"""The S3 WAL: appends buffered into bulk objects in the object store (no volume needed).

An append is acknowledged once the conditional PUT of the bulk object holding it completed.
Cadence adapts to the load: when no PUT is in flight, the first append starts a bulk at once
(an idle WAL acks at PUT speed); what arrives while a PUT is in flight is grouped into the
next bulk, which is cut when no PUT is running any more, or when `bulk_bytes` are buffered,
or when the oldest buffered append is `bulk_interval_ms` old, whichever comes first (so those
two are upper bounds, not a cadence). At most `max_inflight` PUTs run at once, and at most
`max_unacked` bulks are cut and not yet acknowledged; PUTs may complete out of order, but
appends are acknowledged strictly in position order. The two limits differ so that one slow
PUT does not stop the others: the bulks after it keep being cut and PUT while it runs (a
window of unacknowledged bulks as wide as the PUTs running would idle every PUT slot behind
the slowest), and only its own appends and those after it wait for it.

Keys (per node, sorted so a listing is replay order):

    wal/<node>/data/<node epoch>/<first position>   bulk objects (end = first + size);
                                                    an empty one is a tombstone (below)
    wal/<node>/fence/<node epoch>                   one marker per incarnation
    wal/<node>/trim/<node epoch>                    the epoch's trim position
    wal/<node>/closed/<node epoch>                  the incarnation closed cleanly

(Keys `<first>-<end>` of the previous layout are still replayed.)

Replay order and holes: within an epoch, positions are dense, so the bulks replayed must
chain (each starts where the previous ended). A hole means either a PUT that never
completed (then nothing after it was acknowledged: acks are in order) or bulks that trim
deleted (then everything before the hole was committed). `trim` writes the epoch's trim
position before it deletes anything, so a hole above that position is always the first
kind: replay of the epoch stops there, and the later bulks (complete PUTs of appends never
acknowledged) are dropped rather than replayed with a gap in their streams. The only other
deleter of bulks is `start()` after a recovery, which deletes what that recovery already
committed or dropped, so a hole it leaves behind hides nothing either.

Fencing, with nothing but the PUT on the ack path. A bulk's key is determined by its epoch
and first position, and every bulk is written with a conditional create (If-None-Match: *).
A recoverer (a new incarnation of the node, or another node recovering it) writes its fence
marker, lists the data, and for every older epoch whose writer may still be alive (fence
marker present, no `closed` marker) conditionally creates an empty *tombstone* at the first
position its chain does not cover (the hole, or the end). The store lets exactly one of two
creates of a key win:
- the tombstone wins: the old writer's PUT at that position fails with 412, the writer stops
  (WalFencedError) and, since acks are in position order, acknowledges nothing at or after
  that position; everything below it is in the recoverer's chain;
- the old writer's PUT wins: the recoverer's create fails, it reads that bulk (it may have
  been acknowledged), appends it to the chain and tries the next position, until a tombstone
  is created or found.
So the chain the recoverer replays holds every append the old writer ever acknowledged, and
the old writer can acknowledge nothing beyond it: no LIST after each PUT (the previous design:
an ack cost a PUT plus a LIST), and no clock or lease assumption. Tombstones are never deleted
(a writer frozen for any length of time must still hit it when it resumes); one empty object
per epoch that ended without `close()`. A cleanly closed epoch writes its `closed` marker after
its last PUT settled, so recovering it needs no tombstone, provided the recoverer reads the
`closed` markers before it lists the data (then the listing holds every bulk of that epoch);
markers of older epochs go in `start()`. Fence markers also keep an older incarnation from starting (recover() refuses) and
mark which epochs still need replay (below).

Bulk object format: a 32-byte header (magic, version, node id, node epoch, record count,
CRC) then records framed as `stream id u64 | stream epoch u64 | base offset u64 | record
count u32 | payload length u32 | payload CRC u32 | header CRC u32 | payload`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque

import crc32c

from automq.broker.objectstore import ObjectNotFound, ObjectStore, PreconditionFailed
from automq.broker.storage.wal.base import (
    RecoveryReport,
    WalClosedError,
    WalCorruptionError,
    WalFencedError,
    WalRecord,
    WriteAheadLog,
)

log = logging.getLogger(__name__)

BULK_MAGIC = 0x414D5142  # "AMQB"
BULK_VERSION = 1
BULK_HEADER = struct.Struct(">IHHqqII")  # magic, version, flags, node id, node epoch, count, crc = 32 bytes
REC_HEADER = struct.Struct(">QQQIII")  # + header crc u32 = 44 bytes
REC_HEADER_SIZE = REC_HEADER.size + 4
MAX_INFLIGHT = 4  # PUTs at once
MAX_UNACKED = 16  # bulks cut and not yet acknowledged (behind a slow PUT)
INLINE_ENCODE_BYTES = 1 << 20


def data_prefix(node_id: int) -> str:
    return f"wal/{node_id}/data/"


def fence_prefix(node_id: int) -> str:
    return f"wal/{node_id}/fence/"


def trim_prefix(node_id: int) -> str:
    return f"wal/{node_id}/trim/"


def closed_prefix(node_id: int) -> str:
    return f"wal/{node_id}/closed/"


def data_key(node_id: int, node_epoch: int, start: int) -> str:
    return f"{data_prefix(node_id)}{node_epoch:010d}/{start:020d}"


def parse_data_key(node_id: int, key: str, size: int) -> tuple[int, int, int] | None:
    """(epoch, start, end) of a bulk key, None for a key that is not one. An empty object
    under the current layout is a tombstone: start == end."""
    try:
        epoch_s, span = key[len(data_prefix(node_id)) :].split("/")
        if "-" in span:  # the previous layout named the end too
            start_s, end_s = span.split("-")
            return int(epoch_s), int(start_s), int(end_s)
        start = int(span)
        return int(epoch_s), start, start + size
    except ValueError:
        return None


def encode_bulk(node_id: int, node_epoch: int, records: list[WalRecord]) -> bytes:
    parts: list[bytes | memoryview] = []
    for r in records:
        head = REC_HEADER.pack(
            r.stream_id, r.stream_epoch, r.base_offset, r.record_count, len(r.payload), crc32c.crc32c(r.payload)
        )
        parts.append(head + struct.pack(">I", crc32c.crc32c(head)))
        parts.append(r.payload)
    body = b"".join(parts)
    head = BULK_HEADER.pack(BULK_MAGIC, BULK_VERSION, 0, node_id, node_epoch, len(records), 0)
    return head[:-4] + struct.pack(">I", crc32c.crc32c(head[:-4])) + body


def decode_bulk(data: bytes, key: str, start_position: int) -> list[WalRecord]:
    view = memoryview(data)
    if len(view) < BULK_HEADER.size:
        raise WalCorruptionError(f"S3 WAL object {key}: {len(view)} bytes is shorter than its header")
    magic, version, _f, _node, _epoch, count, crc = BULK_HEADER.unpack_from(view, 0)
    if magic != BULK_MAGIC or crc32c.crc32c(view[: BULK_HEADER.size - 4]) != crc:
        raise WalCorruptionError(f"S3 WAL object {key}: bad header (magic {magic:#x})")
    if version != BULK_VERSION:
        raise WalCorruptionError(f"S3 WAL object {key}: unsupported version {version}")
    pos = BULK_HEADER.size
    out = []
    for i in range(count):
        if pos + REC_HEADER_SIZE > len(view):
            raise WalCorruptionError(f"S3 WAL object {key}: record {i} header is truncated")
        head = view[pos : pos + REC_HEADER.size]
        (hcrc,) = struct.unpack_from(">I", view, pos + REC_HEADER.size)
        if crc32c.crc32c(head) != hcrc:
            raise WalCorruptionError(f"S3 WAL object {key}: record {i} header CRC mismatch")
        sid, sepoch, base, n, length, pcrc = REC_HEADER.unpack(head)
        pos += REC_HEADER_SIZE
        payload = view[pos : pos + length]
        if len(payload) != length or crc32c.crc32c(payload) != pcrc:
            raise WalCorruptionError(f"S3 WAL object {key}: payload CRC mismatch for stream {sid} offset {base}")
        pos += length
        out.append(WalRecord(sid, sepoch, base, n, payload, start_position + pos))
    if pos != len(view):
        raise WalCorruptionError(f"S3 WAL object {key}: {len(view) - pos} trailing bytes")
    return out


class _Bulk:
    __slots__ = ("done", "end", "error", "key", "pending", "start")

    def __init__(self, pending: list, start: int, end: int, key: str) -> None:
        self.pending = pending
        self.start = start
        self.end = end
        self.key = key
        self.done = False
        self.error: BaseException | None = None


class ObjectStoreWal(WriteAheadLog):
    def __init__(
        self,
        store: ObjectStore,
        node_id: int,
        node_epoch: int,
        *,
        bulk_interval_ms: int = 250,
        bulk_bytes: int = 8 << 20,
        max_inflight: int = MAX_INFLIGHT,
        max_unacked: int = MAX_UNACKED,
        metrics=None,
    ) -> None:
        self._store = store
        self.node_id = node_id
        self.node_epoch = node_epoch
        self._interval = bulk_interval_ms / 1000
        self._bulk_bytes = bulk_bytes
        self._metrics = metrics
        self._buffer: list[tuple[WalRecord, asyncio.Future[int]]] = []
        self._buffer_bytes = 0
        self._buffer_since = 0.0
        self._kick = asyncio.Event()
        self._inflight: deque[_Bulk] = deque()  # cut, not yet acknowledged, in position order
        self._max_inflight = max(1, max_inflight)
        self._max_unacked = max(self._max_inflight, max_unacked)
        self._trim_lock = asyncio.Lock()
        self._uploaded: deque[tuple[int, str]] = deque()  # (end position, key) of durable bulks
        self._next = 0
        self._durable = 0
        self._trimmed = 0
        self._recovered_keys: list[str] = []
        self._task: asyncio.Task | None = None
        self._put_tasks: set[asyncio.Task] = set()
        self._puts_running = 0  # bulks being encoded or PUT
        self._closed = False
        self._started = False
        self._failed: BaseException | None = None
        self.report = RecoveryReport()

    def _data_key(self, start: int) -> str:
        return data_key(self.node_id, self.node_epoch, start)

    # ------------------------------------------------------------------ recovery

    async def _epochs_marked(self, prefix: str) -> set[int]:
        out = set()
        async for info in self._store.list(prefix):
            try:
                out.add(int(info.key.rsplit("/", 1)[1]))
            except ValueError:
                continue
        return out

    async def _newest_fence(self) -> int:
        return max(await self._epochs_marked(fence_prefix(self.node_id)), default=-1)

    async def recover(self) -> list[WalRecord]:
        fenced = await self._epochs_marked(fence_prefix(self.node_id))
        newest = max(fenced, default=-1)
        if newest > self.node_epoch:
            raise WalFencedError(
                f"S3 WAL of node {self.node_id} is fenced by epoch {newest} (this is epoch {self.node_epoch})"
            )
        await self._store.put(f"{fence_prefix(self.node_id)}{self.node_epoch:010d}", b"")
        # Listed again after our marker: of two incarnations starting at once, each LISTs
        # after its own PUT, so at least one sees the other. An older one that sees ours
        # stops (above, in its own recover()); one we see here is treated as live below.
        fenced = await self._epochs_marked(fence_prefix(self.node_id))
        newest = max(fenced, default=-1)
        if newest > self.node_epoch:
            raise WalFencedError(
                f"S3 WAL of node {self.node_id} is fenced by epoch {newest} (this is epoch {self.node_epoch})"
            )
        report = RecoveryReport(stop_reason="empty")
        # Before the data listing: a `closed` marker is written after its epoch's last PUT
        # settled, so every bulk of an epoch seen closed here is in the listing below. Read
        # after it, a writer could finish more PUTs (acknowledged) and close in between, and
        # its epoch would get no tombstone and lose them from the chain.
        closed = await self._epochs_marked(closed_prefix(self.node_id))
        keys: list[tuple[int, int, int, str]] = []
        async for info in self._store.list(data_prefix(self.node_id)):
            parsed = parse_data_key(self.node_id, info.key, info.size)
            if parsed is None:
                report.details.append(f"ignored foreign key {info.key}")
                continue
            if parsed[0] <= self.node_epoch:
                keys.append((*parsed, info.key))
        keys.sort()
        trims = await self._trim_positions()
        by_epoch: dict[int, list[tuple[int, int, str]]] = {}
        for epoch, start, end, key in keys:
            by_epoch.setdefault(epoch, []).append((start, end, key))
        # Epochs whose writer may still be alive: each gets a tombstone past its chain.
        live = {e for e in fenced if e < self.node_epoch and e not in closed}
        records: list[WalRecord] = []
        tombstones: list[str] = []
        position = 0
        for epoch in sorted(set(by_epoch) | live):
            expected = trims.get(epoch, 0)
            if epoch not in fenced:
                # Every incarnation writes its fence marker before any bulk, and only
                # start() after a recovery deletes it (after deleting that recovery's
                # bulks): this epoch was recovered already. What is left is a PUT that
                # landed after that (never acknowledged: that recovery's tombstone or its
                # writer's `closed` marker came first), a tombstone, or a bulk whose delete
                # failed (committed): none is replayed.
                for start, end, key in by_epoch.get(epoch, []):
                    if start == end and "-" not in key.rsplit("/", 1)[1]:
                        tombstones.append(key)
                    else:
                        report.details.append(f"epoch {epoch} was recovered before; dropped its leftover {key}")
                continue
            ended = False  # the chain reached a hole or a tombstone
            tombstoned = False  # ... a tombstone: its end is claimed already
            for start, end, key in by_epoch.get(epoch, []):
                if start == end:
                    tombstones.append(key)
                    if start == expected and not ended:
                        ended = tombstoned = True  # an earlier recovery of this epoch ended it here
                    continue
                if ended:
                    report.details.append(f"epoch {epoch}: dropped unacknowledged bulk {key} past the chain's end")
                    continue
                if end <= expected:
                    continue  # below the epoch's trim position: committed already (a trim that did not finish)
                if start > expected:
                    # A hole above the trim position: a PUT that never completed. Nothing after it
                    # in this epoch was acknowledged; replaying it would leave gaps in streams.
                    report.details.append(
                        f"epoch {epoch}: no bulk at position {expected}; dropped unacknowledged bulk {key}"
                    )
                    ended = True
                    continue
                try:
                    data = await self._store.get(key)
                except ObjectNotFound:
                    # deleted after we listed (a racing earlier incarnation's trim): committed
                    expected = end
                    continue
                if len(data) != end - start:
                    raise WalCorruptionError(f"S3 WAL object {key}: {len(data)} bytes, its key says {end - start}")
                position = self._replayed(data, key, position, records, report)
                expected = end
            if epoch in live and not tombstoned:
                # at the hole, or past the last bulk (a bulk listed past the hole may end up
                # replayed after all, if the hole's PUT lands first: the claim then walks on)
                position = await self._claim_end(epoch, expected, position, records, report, tombstones)
        report.end_position = position
        # start() deletes all of them but the tombstones: replayed ones once committed,
        # dropped ones because they hold only appends that were never acknowledged.
        keep = set(tombstones)
        self._recovered_keys = [k for _, _, _, k in keys if k not in keep]
        self.report = report
        return records

    def _replayed(self, data: bytes, key: str, position: int, records: list[WalRecord], report: RecoveryReport) -> int:
        recs = decode_bulk(data, key, position)
        records.extend(recs)
        report.records += len(recs)
        report.bytes += sum(len(r.payload) for r in recs)
        report.stop_reason = "end"
        return position + len(data)

    async def _claim_end(
        self,
        epoch: int,
        at: int,
        position: int,
        records: list[WalRecord],
        report: RecoveryReport,
        tombstones: list[str],
    ) -> int:
        """End `epoch`'s chain at position `at` with a tombstone, the fence of a writer that
        may still be alive. Losing the create means its writer's PUT landed there after our
        listing (and may be acknowledged): replay it and claim the next position."""
        while True:
            key = data_key(self.node_id, epoch, at)
            try:
                await self._store.put(key, b"", if_none_match=True)
                tombstones.append(key)
                return position
            except PreconditionFailed:
                pass
            try:
                data = await self._store.get(key)
            except ObjectNotFound:
                continue  # cannot happen (nobody deletes above a chain's end); try again
            if not data:
                tombstones.append(key)  # another recoverer's tombstone
                return position
            report.details.append(f"epoch {epoch}: bulk {key} landed while recovering; replayed")
            position = self._replayed(data, key, position, records, report)
            at += len(data)

    async def _trim_positions(self) -> dict[int, int]:
        out: dict[int, int] = {}
        async for info in self._store.list(trim_prefix(self.node_id)):
            try:
                epoch = int(info.key.rsplit("/", 1)[1])
                if epoch <= self.node_epoch:
                    out[epoch] = int((await self._store.get(info.key)).decode())
            except (ValueError, ObjectNotFound):
                continue
        return out

    async def start(self, trim_position: int) -> None:
        # Everything replayed is committed now: drop it, and older incarnations' markers.
        if self._recovered_keys:
            await self._store.delete_many(self._recovered_keys)
            self._recovered_keys = []
        # Markers after data: a trim marker deleted while some of its epoch's bulks stay
        # would only make a later recovery drop bulks this one already committed.
        old_markers = []
        for prefix in (trim_prefix(self.node_id), fence_prefix(self.node_id), closed_prefix(self.node_id)):
            async for info in self._store.list(prefix):
                try:
                    if int(info.key.rsplit("/", 1)[1]) < self.node_epoch:
                        old_markers.append(info.key)
                except ValueError:
                    continue
        if old_markers:
            await self._store.delete_many(old_markers)
        self._task = asyncio.create_task(self._flush_loop(), name=f"s3-wal-{self.node_id}")
        self._started = True

    # ------------------------------------------------------------------ appends

    @property
    def durable_position(self) -> int:
        return self._durable

    @property
    def bytes_pending_trim(self) -> int:
        return self._next - self._trimmed

    def append(self, record: WalRecord) -> asyncio.Future[int]:
        if self._failed is not None:
            raise WalClosedError(f"S3 WAL of node {self.node_id} failed: {self._failed}") from self._failed
        if self._closed or self._task is None:
            raise WalClosedError(f"S3 WAL of node {self.node_id} is not accepting appends")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if not self._buffer:
            self._buffer_since = time.monotonic()
        self._buffer.append((record, fut))
        self._buffer_bytes += len(record.payload) + REC_HEADER_SIZE
        if len(self._buffer) == 1 or self._buffer_bytes >= self._bulk_bytes:
            self._kick.set()  # an idle WAL starts a bulk now; a full buffer is due now
        return fut

    def _due_in(self) -> float | None:
        """Seconds until the buffer must be cut (0: now), or None: wait for a kick (every
        PUT slot is taken, or the window of unacknowledged bulks is full; a PUT that ends and
        an acknowledgement both kick)."""
        if self._puts_running >= self._max_inflight or len(self._inflight) >= self._max_unacked:
            return None
        if not self._puts_running or self._closed or self._buffer_bytes >= self._bulk_bytes:
            return 0.0
        return max(0.0, self._buffer_since + self._interval - time.monotonic())

    async def _flush_loop(self) -> None:
        try:
            while True:
                if not self._buffer:
                    if self._closed:
                        return
                    self._kick.clear()
                    await self._kick.wait()
                    continue
                wait = self._due_in()
                if wait is None or wait > 0:
                    self._kick.clear()
                    try:
                        await asyncio.wait_for(self._kick.wait(), timeout=wait)
                    except TimeoutError:
                        pass
                    continue
                # At most bulk_bytes per object: a burst becomes several PUTs in flight
                # instead of one huge one that everybody waits for.
                taken, size = 0, 0
                for r, _ in self._buffer:
                    n = len(r.payload) + REC_HEADER_SIZE
                    if taken and size + n > self._bulk_bytes:
                        break
                    taken += 1
                    size += n
                pending, self._buffer = self._buffer[:taken], self._buffer[taken:]
                self._buffer_bytes -= size
                if self._buffer:
                    self._buffer_since = time.monotonic() - self._interval  # the rest is due now
                start = self._next
                size = BULK_HEADER.size + sum(REC_HEADER_SIZE + len(r.payload) for r, _ in pending)
                self._next = start + size
                pos = start + BULK_HEADER.size
                for r, _ in pending:
                    pos += REC_HEADER_SIZE + len(r.payload)
                    r.wal_end = pos
                bulk = _Bulk(pending, start, self._next, self._data_key(start))
                self._inflight.append(bulk)
                self._puts_running += 1
                task = asyncio.create_task(self._put(bulk))
                self._put_tasks.add(task)
                task.add_done_callback(self._put_tasks.discard)
        except BaseException as exc:
            self._fail(exc)
            if not isinstance(exc, Exception):
                raise

    async def _put(self, bulk: _Bulk) -> None:
        try:
            records = [r for r, _ in bulk.pending]
            if bulk.end - bulk.start < INLINE_ENCODE_BYTES:
                # a thread hop costs more than CRC and copy of a small bulk (and waits for
                # a free core on a busy machine)
                data = encode_bulk(self.node_id, self.node_epoch, records)
            else:
                data = await asyncio.to_thread(encode_bulk, self.node_id, self.node_epoch, records)
            delay = 0.1
            started = time.perf_counter()
            try:
                while True:
                    try:
                        # Conditional: a recoverer's tombstone at this key fences us (module docstring).
                        await self._store.put(bulk.key, data, if_none_match=True)
                        break
                    except PreconditionFailed:
                        raise
                    except Exception as exc:
                        if self._closed and self._failed is not None:
                            raise
                        log.warning("S3 WAL PUT %s failed (%r); retrying in %.1fs", bulk.key, exc, delay)
                        await asyncio.sleep(delay)
                        delay = min(5.0, delay * 2)
            except PreconditionFailed:
                try:
                    newest = str(await self._newest_fence())
                except Exception:
                    newest = "a newer one"
                raise WalFencedError(
                    f"S3 WAL of node {self.node_id} epoch {self.node_epoch} was fenced by epoch {newest} "
                    f"(a recovery claimed position {bulk.start})"
                ) from None
            finally:
                self._puts_running -= 1
                self._kick.set()  # no PUT running any more: what was grouped can go now
            if self._metrics is not None:
                self._metrics.wal_sync_seconds.observe(time.perf_counter() - started)
                self._metrics.wal_bytes_written.inc(len(data))
            bulk.done = True
            self._complete_in_order()
        except BaseException as exc:
            self._fail(exc)

    def _complete_in_order(self) -> None:
        if self._inflight and self._inflight[0].done:
            self._kick.set()  # the window moved: what was grouped meanwhile can go
        while self._inflight and self._inflight[0].done:
            bulk = self._inflight.popleft()
            self._uploaded.append((bulk.end, bulk.key))
            self._durable = bulk.end
            if self.on_durable is not None:
                self.on_durable([r for r, _ in bulk.pending])
            for r, fut in bulk.pending:
                if not fut.done():
                    fut.set_result(r.wal_end)

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            log.error("S3 WAL of node %d stopped: %r", self.node_id, exc)
            if self.on_failed is not None and isinstance(exc, Exception) and not isinstance(exc, WalFencedError):
                self.on_failed(exc)
        err = exc if isinstance(exc, WalFencedError) else WalClosedError(f"S3 WAL failed: {exc!r}")
        for bulk in self._inflight:
            for _, fut in bulk.pending:
                if not fut.done():
                    fut.set_exception(err)
        self._inflight.clear()
        for _, fut in self._buffer:
            if not fut.done():
                fut.set_exception(err)
        self._buffer = []

    async def trim(self, position: int) -> None:
        # Serialised: the trim marker must only grow, and must be durable before any bulk
        # below it is deleted (see the module docstring: holes above it mean "never acked").
        async with self._trim_lock:
            count = 0
            while count < len(self._uploaded) and self._uploaded[count][0] <= position:
                count += 1
            self._trimmed = max(self._trimmed, position)
            if not count:
                return
            marker = self._uploaded[count - 1][0]
            await self._store.put(f"{trim_prefix(self.node_id)}{self.node_epoch:010d}", str(marker).encode())
            done = [self._uploaded.popleft() for _ in range(count)]
            try:
                await self._store.delete_many([key for _, key in done])
            except BaseException:
                self._uploaded.extendleft(reversed(done))  # the next trim deletes them
                raise

    async def close(self) -> None:
        self._closed = True
        self._kick.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=30)
            except TimeoutError:
                self._task.cancel()
            self._task = None
        if self._put_tasks:
            await asyncio.wait(list(self._put_tasks), timeout=30)
        if self._started and self._failed is None and not self._put_tasks and not self._inflight:
            # Every PUT of this epoch has settled and no more will be made: a recovery of it
            # needs no tombstone (so none is left behind for a clean stop).
            try:
                await self._store.put(f"{closed_prefix(self.node_id)}{self.node_epoch:010d}", b"")
            except Exception as exc:
                log.warning(
                    "S3 WAL of node %d: could not mark epoch %d closed (%r); its recovery will fence it",
                    self.node_id,
                    self.node_epoch,
                    exc,
                )
