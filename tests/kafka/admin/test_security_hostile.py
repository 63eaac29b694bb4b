"""Hostile input to the ACL and quota APIs, sent with kafka-python's own protocol classes:
unknown enum codes, filter values where a binding is needed, a malformed principal, NaN and
negative quotas, unknown entity types. Each bad item gets INVALID_REQUEST with a reason, good
items of the same request still apply, and the broker keeps serving; the controller's HTTP
API refuses malformed bodies with 400."""

from __future__ import annotations

import aiohttp
import pytest
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.acl import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest

OPEN = {"brokers": 1, "kafka": {"authorizer_class_name": "standard", "allow_everyone_if_no_acl_found": True}}
INVALID_REQUEST = 42


def creation(**overrides):
    values = dict(
        resource_type=2,
        resource_name="t",
        resource_pattern_type=3,
        principal="User:alice",
        host="*",
        operation=3,
        permission_type=3,
    )
    values.update(overrides)
    return CreateAclsRequest.AclCreation(**values)


@pytest.mark.parametrize("inprocess_cluster", [OPEN], indirect=True)
def test_bad_acl_and_quota_requests_are_refused_item_by_item(inprocess_cluster) -> None:
    kadmin = KafkaAdminClient(bootstrap_servers=inprocess_cluster.bootstrap, client_id="hostile")
    send = lambda request: kadmin._manager.run(kadmin._manager.send, request)
    try:
        bad = [
            creation(resource_type=0),  # UNKNOWN
            creation(resource_type=1),  # ANY: a filter value
            creation(operation=99),
            creation(operation=1),  # ANY
            creation(permission_type=1),
            creation(resource_pattern_type=2),  # MATCH
            creation(principal="alice"),  # no Type:Name
            creation(resource_name=""),
            creation(resource_type=4, resource_name="not-the-cluster"),
            creation(host=""),
        ]
        response = send(CreateAclsRequest(creations=[creation(), *bad]))
        codes = [r.error_code for r in response.results]
        assert codes == [0] + [INVALID_REQUEST] * len(bad)
        assert all(r.error_message for r in response.results[1:])

        described = send(
            DescribeAclsRequest(
                resource_type_filter=0,
                resource_name_filter=None,
                pattern_type_filter=1,
                principal_filter=None,
                host_filter=None,
                operation=1,
                permission_type=1,
            )
        )
        assert described.error_code == INVALID_REQUEST
        Filter = DeleteAclsRequest.DeleteAclsFilter
        deleted = send(
            DeleteAclsRequest(
                filters=[
                    Filter(
                        resource_type_filter=1,
                        resource_name_filter=None,
                        pattern_type_filter=0,  # UNKNOWN
                        principal_filter=None,
                        host_filter=None,
                        operation=1,
                        permission_type=1,
                    )
                ]
            )
        )
        assert [r.error_code for r in deleted.filter_results] == [INVALID_REQUEST]
        # the good binding survived all of that
        ok = send(
            DescribeAclsRequest(
                resource_type_filter=1,
                resource_name_filter=None,
                pattern_type_filter=1,
                principal_filter=None,
                host_filter=None,
                operation=1,
                permission_type=1,
            )
        )
        assert ok.error_code == 0 and [r.resource_name for r in ok.resources] == ["t"]

        Entry = AlterClientQuotasRequest.EntryData

        def entry(entity, key, value, remove=False):
            return Entry(
                entity=[Entry.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[Entry.OpData(key=key, value=value, remove=remove)],
            )

        altered = send(
            AlterClientQuotasRequest(
                entries=[
                    entry([("user", "ok")], "producer_byte_rate", 1000.0),
                    entry([("user", "x")], "producer_byte_rate", float("nan")),
                    entry([("user", "x")], "producer_byte_rate", -5.0),
                    entry([("user", "x")], "producer_byte_rate", float("inf")),
                    entry([("group", "x")], "producer_byte_rate", 1.0),
                    entry([("user", "x"), ("user", "y")], "producer_byte_rate", 1.0),
                    entry([("ip", "not-an-ip")], "connection_creation_rate", 1.0),
                    entry([("user", "x")], "made_up_rate", 1.0),
                ],
                validate_only=False,
            )
        )
        assert [e.error_code for e in altered.entries] == [0] + [INVALID_REQUEST] * 7
        Component = DescribeClientQuotasRequest.ComponentData
        bad_filter = send(
            DescribeClientQuotasRequest(
                components=[Component(entity_type="group", match_type=0, match="g")], strict=False
            )
        )
        assert bad_filter.error_code == INVALID_REQUEST
        good = send(DescribeClientQuotasRequest(components=[], strict=False))
        assert good.error_code == 0 and [[(e.entity_type, e.entity_name) for e in x.entity] for x in good.entries] == [
            [("user", "ok")]
        ]
    finally:
        kadmin.close()


@pytest.mark.parametrize("inprocess_cluster", [OPEN], indirect=True)
def test_controller_api_refuses_malformed_bodies(inprocess_cluster) -> None:
    url = inprocess_cluster.brokers[0].cluster.urls[0]

    async def post(method: str, body: bytes) -> int:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/{method}", data=body) as resp:
                return resp.status

    for method, body in [
        ("create_acls", b'{"bindings": [{"resource_type": "topic"}]}'),
        ("create_acls", b'{"bindings": "all"}'),
        ("delete_acls", b'{"filters": [{"resource_type": 1000}]}'),
        ("alter_client_quotas", b'{"entries": [{"entity": [["user"]], "ops": {}}]}'),
        ("alter_client_quotas", b"not json"),
    ]:
        assert inprocess_cluster.run(post(method, body)) == 400, (method, body)
