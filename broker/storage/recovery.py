"""WAL recovery: replay records, upload and commit what is not committed yet.

Used in two places:
- `StorageEngine.start()` recovers the node's own WAL before serving.
- `recover_wal(...)` recovers a DEAD node's WAL from another process (failover): the
  controller/operator gives the recoverer a node epoch above the dead node's (which fences
  it), and the recoverer uploads and commits the data under the dead node's id and that
  new epoch, stream by stream under the epoch each record was written with.

Idempotent: the uploader reconciles every commit with the stream metadata, so running it
again after a crash half way only commits what is still missing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from automq.broker.config import StorageConfig
from automq.broker.objectstore import ObjectStore
from automq.broker.storage.cache.log_cache import LogCache
from automq.broker.storage.metadata import ObjectManager, StreamManager
from automq.broker.storage.upload.uploader import Uploader, UploadSettings
from automq.broker.storage.wal.base import RecoveryReport, WalRecord, WriteAheadLog

log = logging.getLogger(__name__)


async def upload_recovered(
    records: list[WalRecord],
    store: ObjectStore,
    streams: StreamManager,
    objects: ObjectManager,
    settings: UploadSettings,
    node_id: int,
    node_epoch: int,
) -> None:
    """Upload and commit replayed records (in WAL order), in blocks of upload_block_bytes."""
    cache = LogCache(max_bytes=0)  # nothing stays cached after upload
    uploader = Uploader(cache, None, store, streams, objects, settings, node_id, node_epoch)
    for r in records:
        cache.put(r.stream_id, r.stream_epoch, r.base_offset, r.record_count, r.payload, r.wal_end)
        if cache.open_block.size >= settings.upload_block_bytes:
            cache.seal()
    await uploader.flush()


async def recover_wal(
    *,
    object_store: ObjectStore,
    streams: StreamManager,
    objects: ObjectManager,
    node_id: int,
    node_epoch: int,
    kind: str = "s3",
    volume_path: str | Path | None = None,
    storage: StorageConfig | None = None,
) -> RecoveryReport:
    """Recover another (dead) node's WAL. `node_id` is the dead node; `node_epoch` must be
    newer than any epoch it used (the caller obtained it from the controller, fencing the
    dead node). kind="s3": its bulk objects in `object_store`; kind="volume": the WAL file or
    device at `volume_path` (e.g. its volume attached here). Returns what replay found."""
    settings = UploadSettings.of(storage or StorageConfig())
    if kind == "volume":
        if volume_path is None:
            raise ValueError("recover_wal(kind='volume') needs volume_path")
        if not Path(volume_path).exists():  # never create an empty WAL where a dead node's should be
            raise FileNotFoundError(f"recover_wal: no WAL at {volume_path}")
        from automq.broker.storage.wal.volume import VolumeWal

        wal: WriteAheadLog = VolumeWal(volume_path, 1 << 16, node_id, node_epoch)
    elif kind == "s3":
        from automq.broker.storage.wal.objectstore import ObjectStoreWal

        wal = ObjectStoreWal(object_store, node_id, node_epoch)
    else:
        raise ValueError(f"recover_wal: kind must be 's3' or 'volume', got {kind!r}")
    try:
        records = await wal.recover()
        if records:
            await upload_recovered(records, object_store, streams, objects, settings, node_id, node_epoch)
        # Mark everything replayed as trimmed (and, for S3, delete the bulk objects).
        await wal.start(wal.report.end_position)
    finally:
        await wal.close()
    log.info(
        "recovered WAL of node %d: %d records, %d bytes (%s)",
        node_id,
        wal.report.records,
        wal.report.bytes,
        wal.report.stop_reason,
    )
    return wal.report
