"""Request handlers, one module per family of Kafka APIs. Importing this package registers them
(each module's `@handles` decorators fill the registry)."""

from __future__ import annotations

from automq.broker.kafka.handlers import (  # noqa: F401 - imported for their registrations
    acls,  # CreateAcls, DescribeAcls, DeleteAcls
    admin,  # topics, configs, records, cluster, reassignments
    api_versions,
    cluster_info,  # ElectLeaders, DescribeTopicPartitions, DescribeQuorum, AlterReplicaLogDirs, telemetry
    consumer_groups,  # KIP-848 ConsumerGroupHeartbeat / ConsumerGroupDescribe
    delegation_tokens,  # Create/Renew/Expire/DescribeDelegationToken
    fetch,
    groups,  # FindCoordinator and the group APIs
    leader_epochs,  # OffsetForLeaderEpoch
    list_offsets,
    metadata,
    produce,
    producers,  # InitProducerId
    quotas,  # AlterClientQuotas, DescribeClientQuotas
    sasl,  # SaslHandshake, SaslAuthenticate
    scram_users,  # Describe/AlterUserScramCredentials
    share_fetch,  # ShareFetch, ShareAcknowledge (KIP-932, the partition leader's side)
    share_groups,  # KIP-932 ShareGroupHeartbeat / ShareGroupDescribe
    share_offsets,  # KIP-932 Describe/Alter/DeleteShareGroupOffsets
    share_state,  # KIP-932 inter-broker Read/Write/DeleteShareGroupState(Summary)
    transaction_admin,  # ListTransactions, DescribeTransactions, DescribeProducers
    transactions,  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit
)
from automq.broker.kafka.handlers.registry import handles, lookup, registrations

__all__ = ("handles", "lookup", "registrations")
