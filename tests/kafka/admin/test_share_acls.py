"""Share groups under the ACL authorizer (in-process brokers, every client User:ANONYMOUS): a
share member needs READ on its group and DESCRIBE on the topics it subscribes to;
ShareGroupDescribe and DescribeShareGroupOffsets need DESCRIBE on the group; group configs
need ALTER_CONFIGS / DESCRIBE_CONFIGS on the group; the inter-broker share-state APIs need
CLUSTER_ACTION. Refusals carry Kafka's codes, granted calls work."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from automq.broker.controller import acls as model
from automq.broker.kafka import codec

ME = "User:ANONYMOUS"
SECURE = {"brokers": 1, "kafka": {"authorizer_class_name": "standard", "allow_everyone_if_no_acl_found": False}}
TOPIC = "sq-acl"


def grant(cluster, *bindings: tuple[model.ResourceType, str, model.AclOperation]) -> None:
    allow, literal = int(model.PermissionType.ALLOW), int(model.PatternType.LITERAL)
    acls = [model.AclBinding(int(r), n, literal, ME, "*", int(op), allow) for r, n, op in bindings]
    results = cluster.run(cluster.brokers[0].cluster.create_acls(acls))
    assert all(code is None for code, _ in results), results
    keys = {a.key() for a in acls}
    deadline = time.monotonic() + 10
    while not keys <= {a.key() for a in cluster.brokers[0].metadata.acls}:
        assert time.monotonic() < deadline, "ACLs did not reach the broker"
        time.sleep(0.05)


def call(port: int, request: Any) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        frame = codec.encode_request(1, request)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, response = codec.decode_response(s.recv(size, socket.MSG_WAITALL), type(request))
    return response


def heartbeat(port: int, group: str, topics: tuple[str, ...]) -> Any:
    from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest

    def once() -> Any:
        return call(
            port,
            ShareGroupHeartbeatRequest(
                group_id=group, member_id=str(uuid.uuid4()), member_epoch=0, subscribed_topic_names=topics
            ),
        )

    deadline = time.monotonic() + 30
    r = once()
    while r.error_code in (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        r = once()
    return r


@pytest.mark.parametrize("inprocess_cluster", [SECURE], indirect=True)
def test_share_group_apis_under_acls(inprocess_cluster) -> None:
    from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
    from kio.schema.describe_share_group_offsets.v1.request import (
        DescribeShareGroupOffsetsRequest,
        DescribeShareGroupOffsetsRequestGroup,
    )
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig,
        AlterConfigsResource,
        IncrementalAlterConfigsRequest,
    )
    from kio.schema.read_share_group_state_summary.v1.request import ReadShareGroupStateSummaryRequest
    from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

    cluster = inprocess_cluster
    R, Op = model.ResourceType, model.AclOperation
    grant(
        cluster,
        (R.GROUP, "sq-ok", Op.READ),
        (R.GROUP, "sq-ok", Op.DESCRIBE),
        (R.GROUP, "sq-conf", Op.ALTER_CONFIGS),
        (R.TOPIC, TOPIC, Op.DESCRIBE),
    )
    cluster.run(cluster.brokers[0].ensure_topic(TOPIC, partitions=2))
    cluster.run(cluster.brokers[0].ensure_topic("sq-secret", partitions=1))
    port = cluster.ports[0]
    assert call(port, FindCoordinatorRequest(key_type=0, coordinator_keys=("sq-ok",))).coordinators[0].error_code in (
        ErrorCode.none,
        ErrorCode.coordinator_not_available,
    )

    ok = heartbeat(port, "sq-ok", (TOPIC,))
    assert ok.error_code == ErrorCode.none, ok
    assert heartbeat(port, "sq-other", (TOPIC,)).error_code == ErrorCode.group_authorization_failed
    secret = heartbeat(port, "sq-ok", (TOPIC, "sq-secret"))
    assert secret.error_code == ErrorCode.topic_authorization_failed and "sq-secret" in secret.error_message

    described = call(
        port, ShareGroupDescribeRequest(group_ids=("sq-ok", "sq-other"), include_authorized_operations=False)
    )
    assert [g.error_code for g in described.groups] == [ErrorCode.none, ErrorCode.group_authorization_failed]
    offsets = call(
        port,
        DescribeShareGroupOffsetsRequest(
            groups=(
                DescribeShareGroupOffsetsRequestGroup(group_id="sq-ok", topics=None),
                DescribeShareGroupOffsetsRequestGroup(group_id="sq-other", topics=None),
            )
        ),
    )
    assert [g.error_code for g in offsets.groups] == [ErrorCode.none, ErrorCode.group_authorization_failed]

    def alter(group: str) -> ErrorCode:
        r = call(
            port,
            IncrementalAlterConfigsRequest(
                resources=(
                    AlterConfigsResource(
                        resource_type=32,
                        resource_name=group,
                        configs=(
                            AlterableConfig(name="share.auto.offset.reset", config_operation=0, value="earliest"),
                        ),
                    ),
                ),
                validate_only=False,
            ),
        )
        return r.responses[0].error_code

    assert alter("sq-conf") == ErrorCode.none
    assert alter("sq-ok") == ErrorCode.group_authorization_failed  # READ/DESCRIBE, not ALTER_CONFIGS

    def describe_configs(group: str) -> ErrorCode:
        r = call(
            port,
            DescribeConfigsRequest(
                resources=(DescribeConfigsResource(resource_type=32, resource_name=group, configuration_keys=None),),
                include_synonyms=False,
                include_documentation=False,
            ),
        )
        return r.results[0].error_code

    assert describe_configs("sq-conf") == ErrorCode.none  # ALTER_CONFIGS implies DESCRIBE_CONFIGS (Kafka)
    assert describe_configs("sq-ok") == ErrorCode.group_authorization_failed

    # the inter-broker share-state API from a client without CLUSTER_ACTION
    rc = ReadShareGroupStateSummaryRequest
    topic_id = ok.assignment.topic_partitions[0].topic_id
    read = call(
        port,
        rc(
            group_id="sq-ok",
            topics=(
                codec.nested(rc, "ReadStateSummaryData")(
                    topic_id=topic_id, partitions=(codec.nested(rc, "PartitionData")(partition=0, leader_epoch=-1),)
                ),
            ),
        ),
    )
    assert read.results[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
