"""JSON shapes of the controller API's results (server encodes, client decodes).

The domain dataclasses (`StreamMetadata`, `ObjectMetadata`, `MetadataImage`, ...) travel as
plain JSON objects whose keys are the dataclass field names; nested tuples are arrays and
`ObjectType` is its integer value. Requests are validated on the server by the pydantic
models in `server.py`; this module only turns results back into the contract's types.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from automq.broker.controller.acls import AclBinding
from automq.broker.controller.protocol import (
    BrokerInfo,
    DelegationTokenInfo,
    Endpoint,
    GroupConfigs,
    MetadataImage,
    PartitionInfo,
    ScramCredentialInfo,
    TopicInfo,
    WalRecoveryJob,
)
from automq.broker.controller.quotas import ClientQuota
from automq.broker.storage.metadata import ObjectMetadata, ObjectType, StreamMetadata, StreamOffsetRange


def to_wire(value: Any) -> Any:
    """Dataclasses (nested) to JSON-native values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value


def stream_metadata(d: dict) -> StreamMetadata:
    return StreamMetadata(
        d["stream_id"],
        d["epoch"],
        d["start_offset"],
        d["end_offset"],
        d["owner_node_id"],
        d["state"],
        dict(d["tags"]),
        tuple((int(e), int(o)) for e, o in d.get("epochs", ())),
    )


def object_metadata(d: dict) -> ObjectMetadata:
    return ObjectMetadata(
        d["object_id"],
        d["object_size"],
        ObjectType(d["object_type"]),
        tuple(StreamOffsetRange(x["stream_id"], x["start_offset"], x["end_offset"]) for x in d["ranges"]),
        d["committed_at_ms"],
        d["node_id"],
    )


def partition_info(d: dict) -> PartitionInfo:
    return PartitionInfo(
        d["topic"],
        d["partition"],
        d["stream_id"],
        d["leader"],
        d["leader_epoch"],
        d["state"],
        d["target"],
        d.get("compacted_end", 0),
    )


def topic_info(d: dict) -> TopicInfo:
    return TopicInfo(d["name"], d["topic_id"], tuple(partition_info(p) for p in d["partitions"]), dict(d["configs"]))


def broker_info(d: dict) -> BrokerInfo:
    return BrokerInfo(
        d["node_id"],
        d["node_epoch"],
        tuple(Endpoint(e["listener"], e["host"], e["port"]) for e in d["endpoints"]),
        d["rack"],
        d["state"],
    )


def wal_recovery_job(d: dict) -> WalRecoveryJob:
    return WalRecoveryJob(
        d["job_id"],
        d["node_id"],
        d["node_epoch"],
        d["state"],
        d["claimed_by"],
        tuple(d["stream_ids"]),
        d.get("recovery_epoch", -1),
    )


def metadata_image(d: dict) -> MetadataImage:
    return MetadataImage(
        d["version"],
        d["cluster_id"],
        d["controller_id"],
        tuple(broker_info(b) for b in d["brokers"]),
        tuple(topic_info(t) for t in d["topics"]),
        tuple(wal_recovery_job(j) for j in d.get("wal_recovery_jobs", ())),
        acls=tuple(AclBinding(**a) for a in d.get("acls", ())),
        client_quotas=tuple(
            ClientQuota(tuple((t, n) for t, n in q["entity"]), dict(q["values"])) for q in d.get("client_quotas", ())
        ),
        scram_credentials=tuple(ScramCredentialInfo(**c) for c in d.get("scram_credentials", ())),
        group_configs=tuple(GroupConfigs(g["group_id"], dict(g["configs"])) for g in d.get("group_configs", ())),
        delegation_tokens=tuple(
            DelegationTokenInfo(**{**t, "renewers": tuple(t["renewers"])}) for t in d.get("delegation_tokens", ())
        ),
    )
