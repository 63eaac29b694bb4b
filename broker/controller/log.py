"""The metadata log: controller state kept as objects in the object store, nothing on disk.

Layout under a prefix (default `controller/`):

    controller/log/00000000000000000042         one entry: a batch of records (JSON)
    controller/snapshots/00000000000000000040   the whole state after entry 40 (zstd JSON)

Entry N is written with a conditional create (`if_none_match`), so of any number of
controllers that try to write N exactly one succeeds: the others learn they are not (or no
longer) the leader. That single rule is the safety of the control plane; leases only decide
who *tries* to write. A writer only writes N after it applied entries 0..N-1, so an entry
always extends the state its writer saw.

Every attempt's bytes are unique (a random nonce in the entry): the S3 backend treats a 412
on an object holding exactly our bytes as our own earlier attempt having landed, so two
writers must never write identical bytes; and `append` itself resolves an unknown outcome by
reading the entry back and comparing nonces.

Recovery: take the newest readable snapshot, then apply entries after it until one is
missing. Old entries are deleted only once two newer snapshots exist, so a standby that is
less than a snapshot interval behind always finds the next entry it needs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from dataclasses import dataclass

import zstandard

from automq.broker.controller.records import Record, record_from_json, record_to_json
from automq.broker.controller.state import MetadataState
from automq.broker.objectstore import ObjectNotFound, ObjectStore, ObjectStoreUnavailable, PreconditionFailed

log = logging.getLogger(__name__)

_SEQ_DIGITS = 20


class LogConflictError(Exception):
    """Another controller wrote this sequence number: the caller is not the leader."""


class LogCorruptError(Exception):
    """An entry or snapshot could not be decoded."""


@dataclass(frozen=True, slots=True)
class LogEntry:
    seq: int
    writer: int  # controller id
    nonce: str  # tells a retried write of our own apart from another writer's
    records: list[Record]


class MetadataLog:
    def __init__(self, store: ObjectStore, prefix: str = "controller/") -> None:
        self.store = store
        self.prefix = prefix
        self._zc = zstandard.ZstdCompressor(level=3)
        self._zd = zstandard.ZstdDecompressor()

    def entry_key(self, seq: int) -> str:
        return f"{self.prefix}log/{seq:0{_SEQ_DIGITS}d}"

    def snapshot_key(self, seq: int) -> str:
        return f"{self.prefix}snapshots/{seq:0{_SEQ_DIGITS}d}"

    # ------------------------------------------------------------------ entries

    @staticmethod
    def encode_entry(seq: int, writer: int, nonce: str, records: list[Record]) -> bytes:
        body = {"seq": seq, "writer": writer, "nonce": nonce, "records": [record_to_json(x) for x in records]}
        return json.dumps(body, separators=(",", ":")).encode()

    @staticmethod
    def decode_entry(data: bytes) -> LogEntry:
        try:
            body = json.loads(data)
            return LogEntry(body["seq"], body["writer"], body["nonce"], [record_from_json(x) for x in body["records"]])
        except (ValueError, KeyError, TypeError) as exc:
            raise LogCorruptError(f"undecodable metadata log entry: {exc}") from exc

    async def read_entry(self, seq: int) -> LogEntry | None:
        try:
            data = await self.store.get(self.entry_key(seq))
        except ObjectNotFound:
            return None
        entry = self.decode_entry(data)
        if entry.seq != seq:
            raise LogCorruptError(f"entry at {self.entry_key(seq)} says seq {entry.seq}")
        return entry

    async def append(self, seq: int, writer: int, records: list[Record], attempts: int = 5) -> None:
        """Write entry `seq` or raise LogConflictError if someone else did. A write whose
        outcome is unknown (timeout) is resolved by reading the entry back."""
        nonce = secrets.token_hex(8)
        data = self.encode_entry(seq, writer, nonce, records)
        key = self.entry_key(seq)
        for attempt in range(attempts):
            try:
                await self.store.put(key, data, if_none_match=True)
                return
            except PreconditionFailed:
                pass  # maybe our own earlier attempt landed: check below
            except ObjectStoreUnavailable:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
            try:
                existing = await self.read_entry(seq)
            except ObjectStoreUnavailable:
                if attempt == attempts - 1:
                    raise
                continue
            if existing is None:
                continue
            if existing.nonce == nonce:
                return
            raise LogConflictError(f"metadata log entry {seq} was written by controller {existing.writer}")
        raise ObjectStoreUnavailable(f"could not write metadata log entry {seq}", key=key)

    # ------------------------------------------------------------------ snapshots

    def encode_snapshot(self, state: MetadataState) -> bytes:
        return self._zc.compress(json.dumps(state.snapshot(), separators=(",", ":")).encode())

    async def write_snapshot(self, seq: int, data: bytes) -> None:
        await self.store.put(self.snapshot_key(seq), data)

    async def snapshot_seqs(self) -> list[int]:
        out = []
        async for info in self.store.list(f"{self.prefix}snapshots/"):
            tail = info.key.rsplit("/", 1)[-1]
            if tail.isdigit():
                out.append(int(tail))
        return sorted(out)

    async def _read_snapshot(self, seq: int) -> MetadataState:
        data = await self.store.get(self.snapshot_key(seq))
        try:
            state = MetadataState.from_snapshot(json.loads(self._zd.decompress(data)))
        except (ValueError, KeyError, TypeError, zstandard.ZstdError) as exc:
            raise LogCorruptError(f"snapshot {seq} is undecodable: {exc}") from exc
        state.last_seq = seq
        return state

    async def truncate(self) -> int:
        """Keep the two newest snapshots and the entries after the older of them."""
        seqs = await self.snapshot_seqs()
        if len(seqs) < 2:
            return 0
        keep_from = seqs[-2]
        doomed = [self.snapshot_key(s) for s in seqs[:-2]]
        async for info in self.store.list(f"{self.prefix}log/"):
            tail = info.key.rsplit("/", 1)[-1]
            if not tail.isdigit() or int(tail) > keep_from:
                break
            doomed.append(info.key)
        for i in range(0, len(doomed), 1000):
            await self.store.delete_many(doomed[i : i + 1000])
        return len(doomed)

    # ------------------------------------------------------------------ recovery

    async def load(self) -> MetadataState:
        """The state after the newest snapshot plus every entry after it."""
        state = MetadataState()
        for seq in reversed(await self.snapshot_seqs()):
            try:
                state = await self._read_snapshot(seq)
                break
            except (LogCorruptError, ObjectNotFound) as exc:
                log.warning("skipping metadata snapshot %d: %s", seq, exc)
        await self.catch_up(state)
        return state

    async def catch_up(self, state: MetadataState, limit: int | None = None) -> int:
        """Apply entries after `state.last_seq` until one is missing; returns how many."""
        applied = 0
        while limit is None or applied < limit:
            entry = await self.read_entry(state.last_seq + 1)
            if entry is None:
                return applied
            for record in entry.records:
                state.apply(record)
            state.last_seq = entry.seq
            applied += 1
        return applied
