"""A live broker's side of failover: recover fenced brokers' S3 WALs.

When the controller fences a broker that still held open streams, it publishes a WAL
recovery job in the metadata image. With an S3 WAL every broker can read every other
broker's WAL, so any live broker may run `WalRecoveryWorker`: it claims a pending job (one
claimer wins), replays the dead node's WAL and commits the data *as that node* under the
recovery epoch the claim returned (`automq.broker.storage.recovery.recover_wal`), then
completes the job, after which the controller reopens the partitions elsewhere under a new
epoch. A volume WAL lives on the dead broker's disk: the operator recovers those (by
restarting the broker with its volume, or claiming the job itself), so the worker only runs
for `wal.kind: s3`.

A claim that fails half way stays with this broker; the worker retries it (re-claiming
returns the same recovery epoch, and recovery only commits what is still missing). If this
broker dies meanwhile, its fencing releases the claim for another broker.
"""

from __future__ import annotations

import asyncio
import logging

from automq.broker.config import StorageConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.protocol import MetadataImage, WalRecoveryJob, WalRecoveryJobError
from automq.broker.objectstore import ObjectStore
from automq.broker.storage.metadata import MetadataError, NodeFencedError

log = logging.getLogger(__name__)


class WalRecoveryWorker:
    def __init__(
        self,
        client: ControllerClient,
        object_store: ObjectStore,
        node_id: int,
        node_epoch: int,
        storage: StorageConfig | None = None,
        watch_timeout_ms: int = 10_000,
    ) -> None:
        self.client = client
        self.object_store = object_store
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.storage = storage
        self.watch_timeout_ms = watch_timeout_ms
        self.recovered: list[int] = []  # job ids this worker completed

    async def run(self) -> None:
        """Follow the metadata and recover every job that appears, until cancelled."""
        version = -1
        while True:
            try:
                image = await self.client.watch_metadata(version, self.watch_timeout_ms)
                version = image.version
                await self.recover_pending(image)
            except asyncio.CancelledError:
                raise
            except NodeFencedError:
                log.warning("WAL recovery worker of node %d stops: this node was fenced", self.node_id)
                return
            except Exception as exc:
                log.warning("WAL recovery worker: %s", exc)
                await asyncio.sleep(1)

    async def recover_pending(self, image: MetadataImage) -> int:
        """Recover the jobs of `image` that are pending or already ours; returns how many."""
        done = 0
        for job in image.wal_recovery_jobs:
            if job.node_id == self.node_id:
                continue  # our own WAL: the storage engine recovers it at start
            if (job.state == "pending" or job.claimed_by == self.node_id) and await self.recover(job):
                done += 1
        return done

    async def recover(self, job: WalRecoveryJob) -> bool:
        from automq.broker.storage.recovery import recover_wal

        try:
            recovery_epoch = await self.client.claim_wal_recovery(job.job_id, self.node_id, self.node_epoch)
        except WalRecoveryJobError:
            return False  # another broker won the claim, or the node came back
        log.info("recovering the WAL of node %d (job %d, recovery epoch %d)", job.node_id, job.job_id, recovery_epoch)
        report = await recover_wal(
            object_store=self.object_store,
            streams=self.client,
            objects=self.client,
            node_id=job.node_id,
            node_epoch=recovery_epoch,
            kind="s3",
            storage=self.storage,
        )
        try:
            await self.client.complete_wal_recovery(job.job_id, self.node_id, self.node_epoch)
        except MetadataError as exc:
            log.warning("completing WAL recovery job %d failed: %s", job.job_id, exc)
            return False
        log.info("recovered the WAL of node %d: %d records, %d bytes", job.node_id, report.records, report.bytes)
        self.recovered.append(job.job_id)
        return True
