"""`InProcessMetadata`: StreamManager + ObjectManager in one process, durable in the object store.

For tests and single-process use (local mode without a controller). It enforces every rule
of the contract in `metadata.py`; the rule checks are the small `_rule_*`/`_do_*` functions
below so they can be read (and compared with the controller's) in one sitting.

Durability: the whole state is one JSON document (`metadata/inprocess/state.json`), replaced
with a conditional PUT on the ETag it was read at (created with If-None-Match). Two
processes sharing a bucket cannot both win a change: the loser gets PreconditionFailed,
reloads the newest state and re-applies its change, so every rule is checked against the
state that actually won. (A version number inside the state makes every ETag distinct.)

Deviation from the letter of the contract, on purpose: opening a stream with the SAME epoch
it already has is allowed for the same node (a reopen) or when the stream is closed, but not
while another node holds it open under that epoch (that would let two owners append).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from typing import Any

from automq.broker.objectstore import ObjectNotFound, ObjectStore, PreconditionFailed
from automq.broker.storage.metadata import (
    CommitStreamSetObjectRequest,
    MetadataError,
    NodeFencedError,
    ObjectMetadata,
    ObjectNotPreparedError,
    ObjectType,
    OffsetMismatchError,
    StreamFencedError,
    StreamMetadata,
    StreamNotFoundError,
    StreamNotOpenError,
    StreamObject,
    StreamOffsetRange,
    object_key,
)

log = logging.getLogger(__name__)

STATE_KEY = "metadata/inprocess/state.json"
MAX_RETRIES = 50


def _now_ms() -> int:
    return int(time.time() * 1000)


def _empty_state() -> dict[str, Any]:
    return {
        "version": 0,
        "next_stream_id": 0,
        "next_object_id": 0,
        "nodes": {},  # node_id -> node_epoch
        "streams": {},  # stream_id -> {epoch, start, end, owner, state, tags}
        "objects": {},  # object_id -> {size, type, ranges: [[sid, start, end]], at, node}
        "prepared": {},  # object_id -> expiry ms
        "garbage": {},  # object key -> delete after ms
    }


class InProcessMetadata:
    def __init__(self, object_store: ObjectStore, *, gc_retention_ms: int = 60_000) -> None:
        self._store = object_store
        self._gc_retention_ms = gc_retention_ms
        self._state: dict[str, Any] | None = None
        self._etag: str | None = None
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ persistence

    async def _load_latest(self) -> tuple[dict[str, Any], str | None]:
        """The newest state and the ETag it has. HEAD, GET, HEAD: the two HEADs agreeing
        proves the body read belongs to that ETag."""
        while True:
            try:
                before = await self._store.head(STATE_KEY)
                body = await self._store.get(STATE_KEY)
                after = await self._store.head(STATE_KEY)
            except ObjectNotFound:
                if await self._store.exists(STATE_KEY):
                    continue  # created between our calls
                return _empty_state(), None
            if before.etag == after.etag:
                return json.loads(body), after.etag

    async def refresh(self) -> None:
        async with self._lock:
            self._state, self._etag = await self._load_latest()

    async def _read(self) -> dict[str, Any]:
        """The newest state: one HEAD tells whether another process changed it since."""
        async with self._lock:
            if self._state is not None:
                try:
                    current = (await self._store.head(STATE_KEY)).etag
                except ObjectNotFound:
                    current = None
                if current == self._etag:
                    return self._state
            self._state, self._etag = await self._load_latest()
            return self._state

    async def _mutate(self, change):
        """Apply `change(state)` to a copy of the newest state and write it as the next
        version. Rule violations (MetadataError) propagate without writing anything."""
        async with self._lock:
            if self._state is None:
                self._state, self._etag = await self._load_latest()
            for _ in range(MAX_RETRIES):
                new = copy.deepcopy(self._state)
                now = _now_ms()
                deletable = self._sweep(new, now)
                try:
                    result = change(new, now)
                except MetadataError:
                    # Judged against our copy; another process may have moved on. Only a
                    # verdict on the newest state counts.
                    latest, etag = await self._load_latest()
                    if etag == self._etag:
                        raise
                    self._state, self._etag = latest, etag
                    continue
                new["version"] += 1
                body = json.dumps(new, separators=(",", ":")).encode()
                try:
                    if self._etag is None:
                        put = await self._store.put(STATE_KEY, body, if_none_match=True)
                    else:
                        put = await self._store.put(STATE_KEY, body, if_match=self._etag)
                except PreconditionFailed:
                    self._state, self._etag = await self._load_latest()
                    continue
                self._state, self._etag = new, put.etag
                await self._delete_quietly(deletable)
                return result
            raise RuntimeError("metadata state kept changing under us; gave up after retries")

    async def _delete_quietly(self, keys: list[str]) -> None:
        if not keys:
            return
        try:
            await self._store.delete_many(keys)
        except Exception:  # garbage stays garbage; the next sweep or a GC job retries
            log.warning("could not delete %d obsolete objects", len(keys), exc_info=True)

    def _sweep(self, s: dict[str, Any], now: int) -> list[str]:
        """Expire prepared ids (whatever was written under them becomes garbage) and return
        garbage keys whose retention has passed."""
        for oid, expiry in list(s["prepared"].items()):
            if expiry <= now:
                del s["prepared"][oid]
                s["garbage"][object_key(int(oid))] = now
        due = [k for k, t in s["garbage"].items() if t <= now]
        for k in due:
            del s["garbage"][k]
        return due

    # ------------------------------------------------------------------ rules

    @staticmethod
    def _rule_node(s: dict[str, Any], node_id: int, node_epoch: int) -> None:
        known = s["nodes"].get(str(node_id), -1)
        if node_epoch < known:
            raise NodeFencedError(f"node {node_id} epoch {node_epoch} is fenced by epoch {known}")
        s["nodes"][str(node_id)] = node_epoch

    @staticmethod
    def _stream(s: dict[str, Any], stream_id: int) -> dict[str, Any]:
        st = s["streams"].get(str(stream_id))
        if st is None:
            raise StreamNotFoundError(f"stream {stream_id} does not exist")
        return st

    @classmethod
    def _rule_owner(cls, s: dict[str, Any], stream_id: int, epoch: int, node_id: int) -> dict[str, Any]:
        """The caller must hold the stream open under its current epoch."""
        st = cls._stream(s, stream_id)
        if epoch < st["epoch"]:
            raise StreamFencedError(f"stream {stream_id} epoch {epoch} is fenced by epoch {st['epoch']}")
        if epoch > st["epoch"] or st["state"] != "open" or st["owner"] != node_id:
            raise StreamNotOpenError(f"stream {stream_id} is not open by node {node_id} under epoch {epoch}")
        return st

    def _rule_prepared(self, s: dict[str, Any], object_id: int, now: int) -> None:
        expiry = s["prepared"].get(str(object_id))
        if expiry is None or expiry <= now:
            raise ObjectNotPreparedError(f"object id {object_id} was not prepared, is already committed, or expired")

    # ------------------------------------------------------------------ node registration (extra)

    async def register_node(self, node_id: int) -> int:
        """Give a starting node a node epoch above every earlier one (fencing its previous
        incarnation). Not part of the contract: the controller does this at broker registration."""

        def change(s, now):
            epoch = s["nodes"].get(str(node_id), -1) + 1
            s["nodes"][str(node_id)] = epoch
            return epoch

        return await self._mutate(change)

    async def fence_node(self, node_id: int, node_epoch: int) -> None:
        """Raise a node's epoch to at least `node_epoch` (what recovery of a dead node does)."""

        def change(s, now):
            self._rule_node(s, node_id, node_epoch)

        await self._mutate(change)

    # ------------------------------------------------------------------ StreamManager

    async def create_stream(self, tags: dict[str, str] | None = None) -> int:
        def change(s, now):
            sid = s["next_stream_id"]
            s["next_stream_id"] += 1
            s["streams"][str(sid)] = {
                "epoch": 0,
                "start": 0,
                "end": 0,
                "owner": -1,
                "state": "closed",
                "tags": dict(tags or {}),
            }
            return sid

        return await self._mutate(change)

    async def open_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> StreamMetadata:
        def change(s, now):
            self._rule_node(s, node_id, node_epoch)
            st = self._stream(s, stream_id)
            if epoch < st["epoch"]:
                raise StreamFencedError(f"stream {stream_id} epoch {epoch} is fenced by epoch {st['epoch']}")
            if epoch == st["epoch"] and st["state"] == "open" and st["owner"] != node_id:
                raise StreamFencedError(
                    f"stream {stream_id} is open by node {st['owner']} under epoch {epoch}; open with a higher epoch"
                )
            st.update(epoch=epoch, owner=node_id, state="open")
            return self._meta(stream_id, st)

        return await self._mutate(change)

    async def close_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
        def change(s, now):
            self._rule_node(s, node_id, node_epoch)
            st = self._stream(s, stream_id)
            if epoch < st["epoch"]:
                raise StreamFencedError(f"stream {stream_id} epoch {epoch} is fenced by epoch {st['epoch']}")
            if st["state"] == "closed" and epoch == st["epoch"]:
                return  # idempotent
            self._rule_owner(s, stream_id, epoch, node_id)
            st["state"] = "closed"

        await self._mutate(change)

    async def trim_stream(
        self, stream_id: int, epoch: int, new_start_offset: int, node_id: int, node_epoch: int
    ) -> None:
        def change(s, now):
            self._rule_node(s, node_id, node_epoch)
            st = self._rule_owner(s, stream_id, epoch, node_id)
            if new_start_offset <= st["start"]:
                return  # never backward
            st["start"] = new_start_offset
            self._collect_below_start(s, now)

        await self._mutate(change)

    async def delete_stream(self, stream_id: int, epoch: int, node_id: int, node_epoch: int) -> None:
        def change(s, now):
            self._rule_node(s, node_id, node_epoch)
            st = self._stream(s, stream_id)
            if epoch < st["epoch"]:
                raise StreamFencedError(f"stream {stream_id} epoch {epoch} is fenced by epoch {st['epoch']}")
            del s["streams"][str(stream_id)]
            self._collect_below_start(s, now)

        await self._mutate(change)

    def _collect_below_start(self, s: dict[str, Any], now: int) -> None:
        """Objects whose every range is deleted or below its stream's start become garbage."""
        for oid, obj in list(s["objects"].items()):
            live = False
            for sid, _start, end in obj["ranges"]:
                st = s["streams"].get(str(sid))
                if st is not None and end > st["start"]:
                    live = True
                    break
            if not live:
                del s["objects"][oid]
                s["garbage"][object_key(int(oid))] = now + self._gc_retention_ms

    async def get_streams(self, stream_ids: list[int]) -> list[StreamMetadata]:
        s = await self._read()
        return [self._meta(sid, s["streams"][str(sid)]) for sid in stream_ids if str(sid) in s["streams"]]

    @staticmethod
    def _meta(stream_id: int, st: dict[str, Any]) -> StreamMetadata:
        return StreamMetadata(
            stream_id, st["epoch"], st["start"], st["end"], st["owner"], st["state"], dict(st["tags"])
        )

    # ------------------------------------------------------------------ ObjectManager

    async def prepare_objects(self, count: int, ttl_ms: int) -> int:
        if count < 1 or ttl_ms < 1:
            raise ValueError(f"prepare_objects needs count >= 1 and ttl_ms >= 1, got {count}, {ttl_ms}")

        def change(s, now):
            first = s["next_object_id"]
            s["next_object_id"] += count
            for oid in range(first, first + count):
                s["prepared"][str(oid)] = now + ttl_ms
            return first

        return await self._mutate(change)

    async def commit_stream_set_object(self, request: CommitStreamSetObjectRequest) -> None:
        def change(s, now):
            self._rule_node(s, request.node_id, request.node_epoch)
            compaction = bool(request.compacted_object_ids)
            if request.object_id >= 0:
                self._rule_prepared(s, request.object_id, now)
            for so in request.stream_objects:
                self._rule_prepared(s, so.object_id, now)
            if compaction:
                self._replace(s, request.compacted_object_ids, now)
            else:
                # Each stream's ranges (stream-set part and stream objects) must continue its
                # committed end, in offset order, under its current epoch, by its owner.
                pieces: list[tuple[int, int, int, int]] = [
                    (r.stream_id, r.epoch, r.start_offset, r.end_offset) for r in request.stream_ranges
                ]
                epochs = {r.stream_id: r.epoch for r in request.stream_ranges}
                for so in request.stream_objects:
                    if so.stream_id not in epochs:
                        st = self._stream(s, so.stream_id)
                        epochs[so.stream_id] = st["epoch"]
                    pieces.append((so.stream_id, epochs[so.stream_id], so.start_offset, so.end_offset))
                for sid, epoch, start, end in sorted(pieces, key=lambda p: (p[0], p[2])):
                    if end <= start:
                        raise OffsetMismatchError(f"stream {sid}: empty or negative range [{start}, {end})")
                    st = self._rule_owner(s, sid, epoch, request.node_id)
                    if start != st["end"]:
                        raise OffsetMismatchError(
                            f"stream {sid}: range [{start}, {end}) does not continue committed end {st['end']}"
                        )
                    st["end"] = end
            if request.object_id >= 0:
                del s["prepared"][str(request.object_id)]
                s["objects"][str(request.object_id)] = {
                    "size": request.object_size,
                    "type": int(ObjectType.STREAM_SET),
                    "ranges": [[r.stream_id, r.start_offset, r.end_offset] for r in request.stream_ranges],
                    "at": now,
                    "node": request.node_id,
                }
            for so in request.stream_objects:
                del s["prepared"][str(so.object_id)]
                self._add_stream_object(s, so, now)
                if so.source_object_ids:
                    self._replace(s, so.source_object_ids, now)
            self._collect_below_start(s, now)

        await self._mutate(change)

    async def commit_stream_object(self, obj: StreamObject, node_id: int, node_epoch: int) -> None:
        def change(s, now):
            self._rule_node(s, node_id, node_epoch)
            self._rule_prepared(s, obj.object_id, now)
            self._stream(s, obj.stream_id)
            del s["prepared"][str(obj.object_id)]
            self._replace(s, obj.source_object_ids, now)
            self._add_stream_object(s, obj, now)

        await self._mutate(change)

    @staticmethod
    def _add_stream_object(s: dict[str, Any], so: StreamObject, now: int) -> None:
        s["objects"][str(so.object_id)] = {
            "size": so.object_size,
            "type": int(ObjectType.STREAM),
            "ranges": [[so.stream_id, so.start_offset, so.end_offset]],
            "at": now,
            "node": -1,
        }

    def _replace(self, s: dict[str, Any], old_ids, now: int) -> None:
        for oid in old_ids:
            if s["objects"].pop(str(oid), None) is not None:
                s["garbage"][object_key(oid)] = now + self._gc_retention_ms

    async def get_objects(self, stream_id: int, start_offset: int, end_offset: int, limit: int) -> list[ObjectMetadata]:
        s = await self._read()
        found = []
        for oid, obj in s["objects"].items():
            for sid, start, end in obj["ranges"]:
                if sid == stream_id and end > start_offset and (end_offset < 0 or start < end_offset):
                    found.append((start, self._object(int(oid), obj)))
                    break
        found.sort(key=lambda f: f[0])
        return [o for _, o in found[:limit]]

    async def get_stream_set_objects(self, node_id: int | None = None) -> list[ObjectMetadata]:
        s = await self._read()
        return [
            self._object(int(oid), obj)
            for oid, obj in sorted(s["objects"].items(), key=lambda kv: int(kv[0]))
            if obj["type"] == int(ObjectType.STREAM_SET) and (node_id is None or obj["node"] == node_id)
        ]

    @staticmethod
    def _object(oid: int, obj: dict[str, Any]) -> ObjectMetadata:
        return ObjectMetadata(
            object_id=oid,
            object_size=obj["size"],
            object_type=ObjectType(obj["type"]),
            ranges=tuple(StreamOffsetRange(sid, a, b) for sid, a, b in obj["ranges"]),
            committed_at_ms=obj["at"],
            node_id=obj["node"],
        )
