"""The volume WAL: a preallocated file (or block device) used as a ring buffer.

Layout:

    [header slot 0: 4 KiB][header slot 1: 4 KiB][ring: capacity bytes]

Header slots alternate (sequence number decides the newest valid one), so a torn header
write leaves the other slot intact. A slot holds capacity, trim position, node id, node
epoch, a generation number, a sequence number and a CRC-32C.

Positions are logical bytes of an endless log; a record at position P lives at ring offset
P % capacity. Every record is framed with a 64-byte header carrying its own position and
the WAL generation, so replay can tell a record of this log from stale bytes of an earlier
lap or an earlier incarnation. A record that would cross the end of the ring is preceded by
a padding marker and written at the start of the next lap.

Group commit: one writer task takes everything queued, writes it with one `pwritev` per
contiguous region and one `fdatasync`, in a dedicated thread (the event loop never blocks),
then resolves the appends' futures in order. Appends that queue while a group syncs are taken
by that thread as the next group as soon as the sync returns, without waiting for the event
loop. A failed write or sync fails every append not yet acknowledged, and the WAL for good.
The ring never overwrites untrimmed data: when it is full the writer asks for an upload
(pressure handler) and waits for `trim`. A trim is made durable (header slot + fdatasync)
before its space is reused, otherwise a crash could leave a header pointing at overwritten
records.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import stat
import struct
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import crc32c

from automq.broker import diskio
from automq.broker.storage.wal.base import (
    RecoveryReport,
    WalClosedError,
    WalCorruptionError,
    WalFencedError,
    WalRecord,
    WalRecordTooLargeError,
    WriteAheadLog,
)

if TYPE_CHECKING:
    from automq.broker.storage.metrics import StorageMetrics

log = logging.getLogger(__name__)

SLOT_SIZE = 4096
DATA_START = 2 * SLOT_SIZE
HEADER_MAGIC = 0x414D5157  # "AMQW"
HEADER_VERSION = 1
# magic, version, flags, capacity, trim, node_id, node_epoch, generation, sequence | crc
HEADER = struct.Struct(">IHHQQqqQQ")
RECORD_MAGIC = 0x57524543  # "WREC"
RECORD_DATA = 1
RECORD_PADDING = 2
# magic, type, flags, reserved, position, generation, stream_id, stream_epoch, base_offset,
# record_count, payload_len, payload_crc | header_crc
RECORD_HEADER = struct.Struct(">IBBHQQQQQIII")
RECORD_HEADER_SIZE = RECORD_HEADER.size + 4  # 64
IOV_MAX = 512
_ZEROS = bytes(1 << 20)


@dataclass(slots=True)
class WalHeader:
    capacity: int
    trim: int
    node_id: int
    node_epoch: int
    generation: int
    sequence: int

    def encode(self) -> bytes:
        body = HEADER.pack(
            HEADER_MAGIC,
            HEADER_VERSION,
            0,
            self.capacity,
            self.trim,
            self.node_id,
            self.node_epoch,
            self.generation,
            self.sequence,
        )
        return body + struct.pack(">I", crc32c.crc32c(body))

    @classmethod
    def decode(cls, raw: bytes) -> WalHeader | None:
        body = raw[: HEADER.size]
        (crc,) = struct.unpack_from(">I", raw, HEADER.size)
        if crc32c.crc32c(body) != crc:
            return None
        magic, version, _flags, capacity, trim, node_id, node_epoch, generation, sequence = HEADER.unpack(body)
        if magic != HEADER_MAGIC or version != HEADER_VERSION:
            return None
        return cls(capacity, trim, node_id, node_epoch, generation, sequence)


class _Pending:
    __slots__ = ("framed", "future", "record")

    def __init__(self, record: WalRecord, future: asyncio.Future[int]) -> None:
        self.record = record
        self.future = future
        self.framed = RECORD_HEADER_SIZE + len(record.payload)


def _record_header(kind: int, position: int, generation: int, rec: WalRecord | None, payload_crc: int) -> bytes:
    if rec is None:
        body = RECORD_HEADER.pack(RECORD_MAGIC, kind, 0, 0, position, generation, 0, 0, 0, 0, 0, 0)
    else:
        body = RECORD_HEADER.pack(
            RECORD_MAGIC,
            kind,
            0,
            0,
            position,
            generation,
            rec.stream_id,
            rec.stream_epoch,
            rec.base_offset,
            rec.record_count,
            len(rec.payload),
            payload_crc,
        )
    return body + struct.pack(">I", crc32c.crc32c(body))


class VolumeWal(WriteAheadLog):
    def __init__(
        self,
        path: str | Path,
        capacity: int,
        node_id: int,
        node_epoch: int,
        *,
        group_commit_delay_ms: int = 0,
        metrics: StorageMetrics | None = None,
    ) -> None:
        self.path = Path(path)
        self._requested_capacity = capacity
        self.node_id = node_id
        self.node_epoch = node_epoch
        self._delay = group_commit_delay_ms / 1000
        self._metrics = metrics
        self._fd = -1
        self._header: WalHeader | None = None
        self._capacity = 0
        self._trim = 0
        self._next = 0  # position the next record will be written at
        self._durable = 0
        self._queue: deque[_Pending] = deque()
        # groups handed to the WAL thread and not yet confirmed on the loop, oldest first
        self._unacked: deque[list[_Pending]] = deque()
        self._side_jobs = 0  # other WAL-thread work queued (trims, zeros): group runs yield to it
        self._wakeup = asyncio.Event()
        self._trimmed = asyncio.Event()
        self._writer: asyncio.Task | None = None
        self._closed = False
        self._no_wait = False  # stopping or fenced: never wait for space again
        self._failed: BaseException | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-sync")
        self._header_lock = asyncio.Lock()
        self._pressure_handler = None
        self._pressure_task: asyncio.Future[object] | None = None
        self.report = RecoveryReport()
        # A fresh file's ring is reserved at open and zeroed once the WAL serves (_zero_fill):
        # the file offset the zeros still start at (-1: nothing to fill), and, on the WAL
        # thread, the highest file offset records have been written up to
        self._fill_from = -1
        self._records_end = DATA_START
        self._filler: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ opening / replay

    def _open_file(self) -> None:
        if self._fd >= 0:
            return
        exists = self.path.exists()
        if not exists:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        st = os.fstat(self._fd)
        is_device = stat.S_ISBLK(st.st_mode)
        if is_device:
            size = os.lseek(self._fd, 0, os.SEEK_END)
        else:
            size = st.st_size
        header = self._read_header()
        if header is None:
            if size > 0 and any(self._pread(0, DATA_START)):
                raise WalCorruptionError(
                    f"WAL {self.path}: neither header slot is valid (not a WAL, or both slots damaged). To start a fresh "
                    f"WAL on it, after making sure nothing in it is needed: dd if=/dev/zero of={self.path} bs=8k count=1"
                )
            # A fresh WAL: its blocks are reserved now (a full disk fails the start, not an
            # append) and its zeros written once the WAL serves (_zero_fill), so later
            # fdatasyncs flush data only (no extent conversion or size change in the hot path).
            # Writing 256 MiB of zeros here was the largest cost of a fresh broker's start-up.
            capacity = self._requested_capacity if not is_device else size - DATA_START
            if capacity < 1 << 16:
                raise ValueError(f"wal.capacity: {capacity} bytes is too small (minimum 64 KiB)")
            if not is_device:
                self._reserve(DATA_START + capacity)
            header = WalHeader(capacity, 0, self.node_id, -1, 0, 0)
            self._write_slot(header)
            diskio.fullsync(self._fd)
        elif header.capacity + DATA_START > max(size, 0) and not is_device:
            raise WalCorruptionError(
                f"WAL {self.path}: header says capacity {header.capacity} but the file has {size} bytes"
            )
        if header.capacity != self._requested_capacity and not is_device:
            log.warning(
                "WAL %s keeps its existing capacity %d (wal.capacity %d applies to new WALs only)",
                self.path,
                header.capacity,
                self._requested_capacity,
            )
        self._header = header
        self._capacity = header.capacity

    def _reserve(self, size: int) -> None:
        if not diskio.reserve(self._fd, size):
            self._preallocate(size)  # no fallocate here: zeros now, as before
            return
        self._fill_from = DATA_START

    async def _zero_fill(self) -> None:
        """Writes the fresh ring's zeros a chunk per WAL-thread turn, between record groups
        (one group waits behind at most one 1 MiB chunk); chunks records already reached are
        skipped. Only a performance matter: replay never relies on the zeros (records carry
        their position and generation), so a crash or an error here loses nothing."""
        end = DATA_START + self._capacity
        position = self._fill_from
        try:
            while position < end and not self._closed:
                step = min(position + len(_ZEROS), end)
                await self._side_job(self._zero_chunk, position, step)
                position = step
        except Exception:
            log.warning("WAL %s: writing the fresh ring's zeros failed; appends still work", self.path, exc_info=True)
        finally:
            self._fill_from = -1

    async def _side_job(self, fn, *args):
        """WAL-thread work besides record groups (a trim's header, a chunk of zeros): a run of
        groups on that thread stops at the next group boundary to let it in."""
        self._side_jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._side_jobs -= 1

    def _zero_chunk(self, start: int, end: int) -> None:
        """On the WAL thread (so no record group runs meanwhile): zeros in [start, end) past
        what records have reached, written back before the next group's fdatasync waits on them."""
        start = max(start, self._records_end)
        if start >= end or self._fd < 0:
            return
        os.pwrite(self._fd, memoryview(_ZEROS)[: end - start], start)
        diskio.datasync(self._fd)

    def _preallocate(self, size: int) -> None:
        pos = 0
        while pos < size:
            n = min(len(_ZEROS), size - pos)
            os.pwrite(self._fd, _ZEROS[:n] if n < len(_ZEROS) else _ZEROS, pos)
            pos += n
        diskio.fullsync(self._fd)

    def _pread(self, pos: int, n: int) -> bytes:
        return os.pread(self._fd, n, pos)

    def _read_header(self) -> WalHeader | None:
        raw = self._pread(0, DATA_START)
        if len(raw) < DATA_START:
            return None
        slots = [WalHeader.decode(raw[i * SLOT_SIZE : i * SLOT_SIZE + HEADER.size + 4]) for i in (0, 1)]
        valid = [s for s in slots if s is not None]
        return max(valid, key=lambda s: s.sequence) if valid else None

    def _write_slot(self, header: WalHeader) -> None:
        os.pwrite(self._fd, header.encode(), (header.sequence % 2) * SLOT_SIZE)

    async def recover(self) -> list[WalRecord]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._open_file)
        assert self._header is not None
        if self._header.node_epoch > self.node_epoch:
            raise WalFencedError(
                f"WAL {self.path} was opened by node {self._header.node_id} epoch {self._header.node_epoch}, newer than this node epoch {self.node_epoch}"
            )
        records, report = await loop.run_in_executor(self._executor, self._replay)
        self.report = report
        return records

    def _replay(self) -> tuple[list[WalRecord], RecoveryReport]:
        header = self._header
        assert header is not None
        cap = header.capacity
        report = RecoveryReport(start_position=header.trim, end_position=header.trim)
        records: list[WalRecord] = []
        if header.node_epoch < 0:
            return records, report  # never written
        with mmap.mmap(self._fd, DATA_START + cap, prot=mmap.PROT_READ) as mm:
            pos = header.trim
            while pos - header.trim < cap:
                ring = pos % cap
                if cap - ring < RECORD_HEADER_SIZE:
                    pos += cap - ring
                    continue
                at = DATA_START + ring
                parsed = self._parse_header(mm, at, pos, header.generation)
                if parsed is None:
                    report.stop_reason = "end" if records else "empty"
                    break
                if parsed == "torn":
                    report.stop_reason = "torn"
                    report.damaged_position = pos
                    report.details.append(f"damaged record header at WAL position {pos}")
                    break
                kind, rec_fields, payload_crc = parsed
                if kind == RECORD_PADDING:
                    pos += cap - ring
                    continue
                stream_id, stream_epoch, base_offset, count, length = rec_fields
                if ring + RECORD_HEADER_SIZE + length > cap:
                    report.stop_reason = "torn"
                    report.damaged_position = pos
                    report.details.append(f"record at WAL position {pos} claims {length} bytes past the ring end")
                    break
                payload = mm[at + RECORD_HEADER_SIZE : at + RECORD_HEADER_SIZE + length]
                if crc32c.crc32c(payload) != payload_crc:
                    report.stop_reason = "torn"
                    report.damaged_position = pos
                    report.details.append(
                        f"payload CRC mismatch for stream {stream_id} offset {base_offset} at WAL position {pos}"
                    )
                    nxt = pos + RECORD_HEADER_SIZE + length
                    if self._valid_record_follows(mm, nxt, cap, header.generation):
                        raise WalCorruptionError(
                            f"WAL {self.path}: record of stream {stream_id} at offset {base_offset} (WAL position {pos}) "
                            "is corrupt but valid records follow it: acknowledged data is damaged"
                        )
                    break
                pos += RECORD_HEADER_SIZE + length
                records.append(WalRecord(stream_id, stream_epoch, base_offset, count, payload, pos))
                report.records += 1
                report.bytes += length
            report.end_position = pos if report.stop_reason != "torn" else report.damaged_position or pos
        if records:
            report.end_position = records[-1].wal_end
            if report.stop_reason == "empty":  # the ring was full of valid records
                report.stop_reason = "end"
        return records, report

    def _valid_record_follows(self, mm: mmap.mmap, pos: int, cap: int, generation: int) -> bool:
        for _ in range(2):  # at most one padding skip
            ring = pos % cap
            if cap - ring < RECORD_HEADER_SIZE:
                pos += cap - ring
                continue
            parsed = self._parse_header(mm, DATA_START + ring, pos, generation)
            if parsed is None or parsed == "torn":
                return False
            if parsed[0] == RECORD_PADDING:
                pos += cap - ring
                continue
            return True
        return False

    @staticmethod
    def _parse_header(mm: mmap.mmap, at: int, expected_pos: int, generation: int):
        raw = mm[at : at + RECORD_HEADER_SIZE]
        magic = int.from_bytes(raw[:4], "big")
        if magic != RECORD_MAGIC:
            return None
        body = raw[: RECORD_HEADER.size]
        (crc,) = struct.unpack_from(">I", raw, RECORD_HEADER.size)
        if crc32c.crc32c(body) != crc:
            # Magic present but header damaged: stale bytes from an old lap look the same
            # only if their CRC matches, so this is a torn or corrupted header.
            return "torn"
        _m, kind, _f, _r, position, gen, stream_id, stream_epoch, base_offset, count, length, payload_crc = (
            RECORD_HEADER.unpack(body)
        )
        if position != expected_pos or gen != generation:
            return None  # a valid record of an earlier lap or incarnation: end of this log
        return kind, (stream_id, stream_epoch, base_offset, count, length), payload_crc

    # ------------------------------------------------------------------ writing

    async def start(self, trim_position: int) -> None:
        loop = asyncio.get_running_loop()
        if self._header is None:
            await self.recover()
        assert self._header is not None
        h = self._header
        new = WalHeader(
            h.capacity, max(trim_position, h.trim), self.node_id, self.node_epoch, h.generation + 1, h.sequence + 1
        )

        def write() -> None:
            self._write_slot(new)
            diskio.datasync(self._fd)

        await loop.run_in_executor(self._executor, write)
        self._header = new
        self._trim = self._next = self._durable = new.trim
        self._writer = asyncio.create_task(self._write_loop(), name=f"wal-writer-{self.path.name}")
        if self._fill_from >= 0:
            self._filler = asyncio.create_task(self._zero_fill(), name=f"wal-zero-fill-{self.path.name}")

    @property
    def durable_position(self) -> int:
        return self._durable

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def bytes_pending_trim(self) -> int:
        return self._next - self._trim

    def append(self, record: WalRecord) -> asyncio.Future[int]:
        if self._closed or self._writer is None:
            raise WalClosedError(f"WAL {self.path} is not accepting appends")
        if self._failed is not None:
            raise WalClosedError(f"WAL {self.path} failed: {self._failed}") from self._failed
        if RECORD_HEADER_SIZE + len(record.payload) > self._capacity // 2:
            raise WalRecordTooLargeError(
                f"a {len(record.payload)}-byte batch does not fit a WAL of {self._capacity} bytes"
                f" (wal.capacity; a batch may take at most half the ring less a {RECORD_HEADER_SIZE}-byte header)"
            )
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(record, fut))
        self._wakeup.set()
        return fut

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._queue:
                    if self._closed:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if self._delay:
                    await asyncio.sleep(self._delay)
                group, segments, end = self._plan_group()
                if not group:
                    if self._closed or self._no_wait:
                        # Nobody will upload and trim any more: what does not fit was never
                        # written, so never acknowledged; fail it instead of waiting.
                        self._refuse_queued(f"WAL {self.path} is full and stopping: append not written")
                        if self._closed:
                            return
                        continue
                    # Ring full: ask for an upload and wait for the trim that frees space.
                    self._trimmed.clear()
                    if self._metrics is not None:
                        self._metrics.wal_full.inc()
                    handler = self._pressure_handler
                    if handler is not None:
                        r = handler()
                        if asyncio.iscoroutine(r):
                            # keep a reference: a task only weakly held by the loop may be collected
                            self._pressure_task = asyncio.ensure_future(r)
                    await self._trimmed.wait()
                    continue
                self._unacked.append(group)
                await loop.run_in_executor(
                    self._executor, self._write_groups, loop, group, segments, end, time.perf_counter()
                )
                if self._failed is not None:
                    raise self._failed
        except BaseException as exc:  # a failed write/sync: nothing unacknowledged can be acknowledged
            if self._failed is None:
                self._failed = exc
            self._fail_unacknowledged(exc)
            if not isinstance(exc, Exception):
                raise
            log.error("WAL %s failed; failing all pending appends", self.path, exc_info=self._failed)
            if self.on_failed is not None:
                self.on_failed(self._failed)

    def _write_groups(
        self, loop: asyncio.AbstractEventLoop, group: list[_Pending], segments, end: int, started: float
    ) -> None:
        """Runs in the WAL thread: writes the group the loop planned, then, as long as appends
        are queued and nothing else waits for this thread (a trim's header, a chunk of zeros),
        plans and writes the next group right here. An append that arrives during a sync is
        then written as soon as that sync returns, not after a round trip through the event
        loop (resolve, plan, hand the group back to this thread), which waits for a loop turn
        while the loop serves a catch-up read. The loop resolves each group's appends, in
        order, through `_complete`."""
        while True:
            self._write_group(segments)
            self._next = end
            loop.call_soon_threadsafe(self._complete, group, end, started)
            if self._delay or self._side_jobs or self._failed is not None or not self._queue:
                return
            started = time.perf_counter()
            group, segments, end = self._plan_group()
            if not group:
                return  # the ring is full: the loop asks for an upload and waits for the trim
            self._unacked.append(group)

    def _complete(self, group: list[_Pending], end: int, started: float) -> None:
        """On the loop: `group` is durable (so is everything written before it)."""
        if self._failed is not None:
            return  # failed meanwhile: its appends were failed with the rest
        self._durable = end
        if self._metrics is not None:
            self._metrics.wal_sync_seconds.observe(time.perf_counter() - started)
            self._metrics.wal_bytes_written.inc(sum(p.framed for p in group))
        try:
            if self.on_durable is not None:
                self.on_durable([p.record for p in group])
        except Exception as exc:
            self._failed = exc
            self._fail_unacknowledged(exc)  # this group (still first in _unacked) included
            return
        self._unacked.popleft()  # groups complete in the order they were handed over: it is `group`
        for p in group:
            if not p.future.done():
                p.future.set_result(p.record.wal_end)

    def _fail_unacknowledged(self, exc: BaseException) -> None:
        """Groups written (or being written) whose sync did not complete, then the queue: none
        of them may be acknowledged (after a failed fdatasync their bytes may never reach the
        disk)."""
        reason = f"WAL {self.path} failed: {exc!r}"
        while self._unacked:
            for p in self._unacked.popleft():
                if not p.future.done():
                    p.future.set_exception(WalClosedError(reason))
        self._refuse_queued(reason)

    def _refuse_queued(self, reason: str) -> None:
        while self._queue:
            p = self._queue.popleft()
            if not p.future.done():
                p.future.set_exception(WalClosedError(reason))

    def stop_waiting(self) -> None:
        self._no_wait = True
        self._trimmed.set()  # wakes a writer waiting for space: it sees _no_wait

    def _plan_group(self):
        """Take queued records that fit in the ring; lay them out. Returns (group, segments,
        end position) where segments are (file offset, [(kind, position, record|None)])."""
        cap = self._capacity
        pos = self._next
        group: list[_Pending] = []
        segments: list[tuple[int, list]] = []
        current: list = []
        seg_start = DATA_START + pos % cap
        while self._queue:
            p = self._queue[0]
            ring = pos % cap
            new_pos = pos
            pad = None
            if cap - ring < p.framed:
                pad = (pos, cap - ring)
                new_pos = pos + (cap - ring)
            if new_pos + p.framed - self._trim > cap:
                break
            self._queue.popleft()
            if pad is not None:
                if pad[1] >= RECORD_HEADER_SIZE:
                    current.append((RECORD_PADDING, pos, None))
                if current:
                    segments.append((seg_start, current))
                current = []
                seg_start = DATA_START
                pos = new_pos
            current.append((RECORD_DATA, pos, p.record))
            pos += p.framed
            p.record.wal_end = pos
            group.append(p)
        if current:
            segments.append((seg_start, current))
        return group, segments, pos

    def _write_group(self, segments: list[tuple[int, list]]) -> None:
        """Runs in the WAL thread: frame, write, sync. CRCs are computed here too, so the
        event loop does no per-byte work."""
        gen = self._header.generation  # type: ignore[union-attr]
        io_seconds = 0.0
        for file_pos, items in segments:
            iov: list[bytes | memoryview] = []
            for kind, position, rec in items:
                if rec is None:
                    iov.append(_record_header(kind, position, gen, None, 0))
                else:
                    iov.append(_record_header(kind, position, gen, rec, crc32c.crc32c(rec.payload)))
                    iov.append(rec.payload)
            for i in range(0, len(iov), IOV_MAX):
                chunk = iov[i : i + IOV_MAX]
                want = sum(len(b) for b in chunk)
                started = time.perf_counter()
                written = os.pwritev(self._fd, chunk, file_pos)
                if written != want:
                    self._write_rest(chunk, written, file_pos)
                io_seconds += time.perf_counter() - started
                file_pos += want
            if file_pos > self._records_end:
                self._records_end = file_pos
        started = time.perf_counter()
        diskio.datasync(self._fd)
        if self._metrics is not None:
            self._metrics.wal_disk_seconds.observe(io_seconds + time.perf_counter() - started)

    def _write_rest(self, chunk: list[bytes | memoryview], written: int, file_pos: int) -> None:
        data = b"".join(bytes(b) for b in chunk)
        while written < len(data):
            written += os.pwrite(self._fd, data[written:], file_pos + written)

    async def trim(self, position: int) -> None:
        if position <= self._trim or self._header is None:
            return
        if position > self._durable:
            raise ValueError(f"cannot trim the WAL to {position}: only {self._durable} is durable")
        async with self._header_lock:
            h = self._header
            if position <= h.trim:
                return
            new = WalHeader(h.capacity, position, h.node_id, h.node_epoch, h.generation, h.sequence + 1)

            def write() -> None:
                self._write_slot(new)
                diskio.datasync(self._fd)

            await self._side_job(write)
            self._header = new
            self._trim = position
            self._trimmed.set()

    async def close(self) -> None:
        if self._closed and self._writer is None and self._fd < 0:
            return
        self._closed = True
        self._wakeup.set()
        self._trimmed.set()  # a writer waiting for space stops waiting (see _write_loop)
        if self._filler is not None:
            await asyncio.wait([self._filler])  # stops after its current chunk (it sees _closed)
            self._filler = None
        if self._writer is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), timeout=30)
            except TimeoutError:
                self._writer.cancel()
            self._writer = None
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            await asyncio.get_running_loop().run_in_executor(self._executor, os.close, fd)
        self._executor.shutdown(wait=False)
