"""Recover a lost broker's volume WAL from outside that broker (`automq wal recover`).

When a broker's Kubernetes node is lost, the operator fences the broker at the controller,
which publishes a WAL recovery job for it (its WAL may hold acknowledged writes that are not
in the object store yet). With `wal.failover: multiAttach` the operator then runs this in a
Job on another node, with the lost broker's WAL volume attached:

    claim the job (as the operator, node id -1)   -> the recovery epoch, above the lost
                                                     broker's: its late writes are refused
    replay the WAL from its trim point, upload and commit as (lost node, recovery epoch)
    mark the replayed part trimmed in the WAL header
    complete the job                              -> the controller places the partitions on
                                                     live brokers

Idempotent: a rerun after completion finds no job and does nothing (so does a run that finds
the broker registered again under a newer epoch than the one fenced: its replacement pod got
the volume first and recovers the WAL itself); a rerun after a crash
half way claims the same job again (same recovery epoch) and the uploader commits only what
is still missing. It refuses to touch the WAL of a broker the controller does not consider
fenced (it may still be writing to it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from automq.broker.config import StorageConfig
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.protocol import WalRecoveryJob
from automq.broker.objectstore import ObjectStore

log = logging.getLogger(__name__)

OPERATOR_NODE_ID = -1  # who claims: not a broker (the controller accepts -1/-1 for the operator)


class WalRecoverError(Exception):
    """Recovery cannot run (yet); the message says why and what to do."""


@dataclass(frozen=True)
class WalRecoverOutcome:
    node_id: int
    job_id: int | None  # None: there was nothing to recover
    recovery_epoch: int = -1
    records: int = 0
    bytes: int = 0
    stop_reason: str = ""

    def summary(self) -> str:
        if self.job_id is None and self.stop_reason == "taken over":
            return f"node {self.node_id} registered again after it was fenced and recovers its own WAL: nothing to do"
        if self.job_id is None:
            return f"node {self.node_id}: no WAL recovery job (already recovered, or nothing was open): nothing to do"
        return (
            f"node {self.node_id}: WAL recovery job {self.job_id} completed under recovery epoch "
            f"{self.recovery_epoch}: {self.records} records, {self.bytes} bytes replayed ({self.stop_reason})"
        )


async def _job_for(client: ControllerClient, node_id: int) -> WalRecoveryJob | None:
    return next((j for j in await client.list_wal_recovery_jobs() if j.node_id == node_id), None)


async def _taken_over(client: ControllerClient, node_id: int, fenced_epoch: int | None) -> bool:
    """The broker registered again after it was fenced at `fenced_epoch` (its replacement pod got
    the volume first): it recovers its own WAL, and this run has nothing left to do."""
    if fenced_epoch is None:
        return False
    image = await client.watch_metadata(since_version=-1, timeout_ms=0)
    broker = next((b for b in image.brokers if b.node_id == node_id), None)
    return broker is not None and broker.state != "fenced" and broker.node_epoch > fenced_epoch


async def recover_lost_wal(
    client: ControllerClient,
    object_store: ObjectStore,
    node_id: int,
    wal_path: str | Path,
    storage: StorageConfig | None = None,
    fenced_epoch: int | None = None,
) -> WalRecoverOutcome:
    """Recover node `node_id`'s volume WAL at `wal_path` through the controller's recovery job.
    `fenced_epoch`: the node epoch the operator fenced; a broker found active under a newer
    epoch came back on its own (and recovers its WAL itself): nothing to do, not an error."""
    from automq.broker.storage.metadata import MetadataError

    try:
        return await _recover(client, object_store, node_id, Path(wal_path), storage, fenced_epoch)
    except (MetadataError, WalRecoverError):
        if await _taken_over(client, node_id, fenced_epoch):
            return WalRecoverOutcome(node_id, None, stop_reason="taken over")
        raise


async def _recover(
    client: ControllerClient,
    object_store: ObjectStore,
    node_id: int,
    path: Path,
    storage: StorageConfig | None,
    fenced_epoch: int | None,
) -> WalRecoverOutcome:
    from automq.broker.storage.recovery import recover_wal

    image = await client.watch_metadata(since_version=-1, timeout_ms=0)
    broker = next((b for b in image.brokers if b.node_id == node_id), None)
    if broker is None:
        raise WalRecoverError(f"node {node_id} is not a registered broker of cluster {image.cluster_id!r}")
    job = await _job_for(client, node_id)
    if job is None:
        if broker.state != "fenced" and (fenced_epoch is None or broker.node_epoch <= fenced_epoch):
            raise WalRecoverError(
                f"broker {node_id} is {broker.state}, not fenced: it may still be writing its WAL. "
                "Fence it first (the operator does on node loss; or the controller's fence_broker)"
            )
        if broker.state != "fenced":
            return WalRecoverOutcome(node_id, None, stop_reason="taken over")
        return WalRecoverOutcome(node_id, None)
    if not path.exists():
        # Never create an empty WAL where the lost broker's should be: the volume is not mounted.
        raise WalRecoverError(f"no WAL at {path}: is the lost broker's WAL volume mounted there?")
    recovery_epoch = await client.claim_wal_recovery(job.job_id, OPERATOR_NODE_ID, -1)
    log.info("claimed WAL recovery job %d of node %d: recovery epoch %d", job.job_id, node_id, recovery_epoch)
    report = await recover_wal(
        object_store=object_store,
        streams=client,
        objects=client,
        node_id=node_id,
        node_epoch=recovery_epoch,
        kind="volume",
        volume_path=path,
        storage=storage,
    )
    await client.complete_wal_recovery(job.job_id, OPERATOR_NODE_ID, -1)
    return WalRecoverOutcome(node_id, job.job_id, recovery_epoch, report.records, report.bytes, report.stop_reason)
