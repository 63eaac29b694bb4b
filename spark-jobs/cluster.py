"""Where the Spark jobs find a cluster, and what they see of it: topics, partitions, the
streams behind them and the committed objects that hold each stream's offsets.

Two sources of the same facts:
- the active controller (`ControllerClient`): what a running cluster uses; the only way to
  commit a compaction;
- the controller's metadata log in the object store (`MetadataLog.load`): a read-only
  snapshot that works with no controller running (a stopped `automq local up` data dir).

Only committed objects are visible: records a broker acknowledged but has not uploaded yet
(still only in its WAL and log cache) are not part of any object, so a job sees each
partition up to the stream's committed end offset, which trails the high watermark by at
most one upload interval.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from automq.broker.controller.client import ControllerClient
from automq.broker.controller.log import MetadataLog
from automq.broker.objectstore import ObjectStore, open_object_store
from automq.broker.storage.metadata import ObjectMetadata, ObjectType

OBJECTS_PAGE = 10_000


class ClusterLocationError(Exception):
    """The job cannot tell where the cluster is; the message names the option to fix."""


@dataclass(frozen=True, slots=True)
class ClusterLocation:
    """How to reach a cluster: an object-store URL, plus controller URLs when one runs."""

    object_store_url: str
    controller_urls: tuple[str, ...] = ()
    metadata_prefix: str = "controller/"

    @classmethod
    def resolve(
        cls,
        *,
        data_dir: str | Path | None = None,
        controller: str | None = None,
        object_store: str | None = None,
    ) -> ClusterLocation:
        """From `--data-dir` (an `automq local up` directory) or explicit URLs; explicit wins."""
        urls: list[str] = [u.strip() for u in controller.split(",") if u.strip()] if controller else []
        store = object_store
        if data_dir is not None:
            d = Path(data_dir)
            record = d / "cluster.yaml"
            if not record.exists():
                raise ClusterLocationError(f"--data-dir {d}: no cluster.yaml (not an `automq local up` data dir)")
            store = store or (yaml.safe_load(record.read_text()) or {}).get("object_store_url")
            config = d / "config" / "controller.yaml"
            if not urls and config.exists():
                raw = yaml.safe_load(config.read_text()) or {}
                urls = [f"http://127.0.0.1:{raw['http_port']}"] if raw.get("http_port") else []
        if not store:
            raise ClusterLocationError("no object store: pass --object-store s3://... or file://..., or --data-dir")
        return cls(store, tuple(urls))

    def to_options(self) -> dict[str, str]:
        """As data-source options (what executors receive)."""
        out = {"objectStore": self.object_store_url}
        if self.controller_urls:
            out["controller"] = ",".join(self.controller_urls)
        return out


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    stream_id: int
    start_offset: int  # log start (after retention trims)
    end_offset: int  # committed end: everything below is in `objects`
    objects: tuple[ObjectMetadata, ...] = ()

    def ranges(self) -> list[tuple[ObjectMetadata, int, int]]:
        """(object, start, end) of this stream's data, clipped to [start_offset, end_offset)."""
        out = []
        for obj in self.objects:
            for rg in obj.ranges:
                if rg.stream_id != self.stream_id:
                    continue
                start, end = max(rg.start_offset, self.start_offset), min(rg.end_offset, self.end_offset)
                if start < end:
                    out.append((obj, start, end))
        out.sort(key=lambda x: x[1])
        return out


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    configs: dict[str, str]
    partitions: tuple[PartitionView, ...] = field(default_factory=tuple)


class ClusterView:
    """Topics and their objects at one moment. Build with `ClusterView.load(location)`."""

    def __init__(self, topics: dict[str, TopicView]) -> None:
        self.topics = topics

    @staticmethod
    async def load_async(
        location: ClusterLocation, topics: list[str] | None = None, *, with_objects: bool = True
    ) -> ClusterView:
        if location.controller_urls:
            return await _from_controller(location, topics, with_objects)
        store = open_object_store(location.object_store_url)
        try:
            return await _from_store(store, location.metadata_prefix, topics, with_objects)
        finally:
            await store.close()

    @staticmethod
    def load(location: ClusterLocation, topics: list[str] | None = None, *, with_objects: bool = True) -> ClusterView:
        return asyncio.run(ClusterView.load_async(location, topics, with_objects=with_objects))

    def topic(self, name: str) -> TopicView:
        t = self.topics.get(name)
        if t is None:
            raise KeyError(f"topic {name!r} does not exist (known: {', '.join(sorted(self.topics)) or 'none'})")
        return t


def _wanted(name: str, topics: list[str] | None) -> bool:
    return topics is None or name in topics


async def _from_controller(location: ClusterLocation, topics: list[str] | None, with_objects: bool) -> ClusterView:
    async with ControllerClient(list(location.controller_urls)) as client:
        image = await client.watch_metadata(-1, 0)
        chosen = [t for t in image.topics if _wanted(t.name, topics)]
        ids = [p.stream_id for t in chosen for p in t.partitions]
        streams = {s.stream_id: s for s in await client.get_streams(ids)} if ids else {}

        async def objects_of(sid: int) -> tuple[ObjectMetadata, ...]:
            s = streams.get(sid)
            if not with_objects or s is None or s.end_offset <= s.start_offset:
                return ()
            out: list[ObjectMetadata] = []
            at = s.start_offset
            while at < s.end_offset:
                page = await client.get_objects(sid, at, s.end_offset, OBJECTS_PAGE)
                if not page:
                    break
                out += page
                at = max(rg.end_offset for rg in page[-1].ranges if rg.stream_id == sid)
                if len(page) < OBJECTS_PAGE:
                    break
            return tuple(out)

        found = await asyncio.gather(*(objects_of(sid) for sid in ids))
        by_stream = dict(zip(ids, found, strict=True))
        views = {}
        for t in chosen:
            parts = []
            for p in t.partitions:
                s = streams.get(p.stream_id)
                start, end = (s.start_offset, s.end_offset) if s else (0, 0)
                parts.append(PartitionView(t.name, p.partition, p.stream_id, start, end, by_stream[p.stream_id]))
            views[t.name] = TopicView(t.name, dict(t.configs), tuple(parts))
        return ClusterView(views)


async def _from_store(store: ObjectStore, prefix: str, topics: list[str] | None, with_objects: bool) -> ClusterView:
    state = await MetadataLog(store, prefix).load()
    views = {}
    for t in state.image().topics:
        if not _wanted(t.name, topics):
            continue
        parts = []
        for p in t.partitions:
            s = state.streams.get(p.stream_id)
            start, end = (s.start_offset, s.end_offset) if s else (0, 0)
            objs = tuple(state.objects_for(p.stream_id, start, end, 1 << 30)) if with_objects and s else ()
            parts.append(PartitionView(t.name, p.partition, p.stream_id, start, end, objs))
        views[t.name] = TopicView(t.name, dict(t.configs), tuple(parts))
    return ClusterView(views)


def object_summary(obj: ObjectMetadata) -> dict[str, Any]:
    return {
        "object_id": obj.object_id,
        "size": obj.object_size,
        "type": "stream-set" if obj.object_type == ObjectType.STREAM_SET else "stream",
        "ranges": [[r.stream_id, r.start_offset, r.end_offset] for r in obj.ranges],
    }
