"""Delegation tokens (KIP-48) against a secured broker: Create / Renew / Expire / Describe as
raw kio requests over SASL (neither confluent-kafka 2.16 nor kafka-python's admin client wraps
them, and librdkafka cannot send SCRAM's tokenauth extension), and a client logging in with the
token (SCRAM, user = token id, password = base64 HMAC, `tokenauth=true`), with Kafka's error
codes for each refusal."""

from __future__ import annotations

import asyncio
import base64
import datetime

import pytest
from conftest import USERS, ThreadedCluster, secure_configs
from kio.schema.errors import ErrorCode

from automq.broker.kafka.client import BrokerConnection, KafkaClientError
from automq.broker.security.client import PLAINTEXT, ClientSecurity


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory, pki):
    tmp = tmp_path_factory.mktemp("tokens")
    key = tmp / "token-secret"
    key.write_text("a-shared-secret-of-the-brokers\n")
    controller_cfg, broker_raw = secure_configs(tmp, pki, delegation_token_secret_key_file=str(key))
    # an authorizer denying by default, alice its only super user: token rules hold with ACLs on
    broker_raw["kafka"].update({"authorizer_class_name": "standard", "super_users": "User:alice"})
    cluster = ThreadedCluster(controller_cfg, broker_raw).start()
    yield cluster
    cluster.stop()


def _sasl(user: str, password: str | None = None, mechanism: str = "PLAIN", token: bool = False) -> ClientSecurity:
    secret = USERS[user] if password is None else password
    return ClientSecurity("SASL_PLAINTEXT", None, mechanism, lambda: (user, secret), token)


def _call(cluster, security: ClientSecurity, *requests, listener: str = "SASL"):
    async def go():
        conn = BrokerConnection("127.0.0.1", cluster.port(listener), client_id="t", security=security, timeout_s=20)
        try:
            return [await conn.call(r) for r in requests]
        finally:
            await conn.close()

    return asyncio.run(go())


def _create(renewers=(), owner: str | None = None, max_lifetime_ms: int = -1):
    from kio.schema.create_delegation_token.v3.request import CreatableRenewers, CreateDelegationTokenRequest

    return CreateDelegationTokenRequest(
        owner_principal_type="User" if owner else None,
        owner_principal_name=owner,
        renewers=tuple(CreatableRenewers(principal_type="User", principal_name=r) for r in renewers),
        max_lifetime=datetime.timedelta(milliseconds=max_lifetime_ms),
    )


def _renew(hmac: bytes, ms: int):
    from kio.schema.renew_delegation_token.v2.request import RenewDelegationTokenRequest

    return RenewDelegationTokenRequest(hmac=hmac, renew_period=datetime.timedelta(milliseconds=ms))


def _expire(hmac: bytes, ms: int):
    from kio.schema.expire_delegation_token.v2.request import ExpireDelegationTokenRequest

    return ExpireDelegationTokenRequest(hmac=hmac, expiry_time_period=datetime.timedelta(milliseconds=ms))


def _describe(owners=None):
    from kio.schema.describe_delegation_token.v3.request import (
        DescribeDelegationTokenOwner,
        DescribeDelegationTokenRequest,
    )

    return DescribeDelegationTokenRequest(
        owners=None
        if owners is None
        else tuple(DescribeDelegationTokenOwner(principal_type="User", principal_name=o) for o in owners)
    )


def _metadata():
    from kio.schema.metadata.v12.request import MetadataRequest

    return MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def _token_login(token_id: str, hmac: bytes, mechanism: str = "SCRAM-SHA-256") -> ClientSecurity:
    return ClientSecurity(
        "SASL_PLAINTEXT", None, mechanism, lambda: (token_id, base64.b64encode(hmac).decode()), token_auth=True
    )


def test_token_lifecycle_and_login(token_cluster):
    (created,) = _call(token_cluster, _sasl("alice"), _create(renewers=["bob"]))
    assert created.error_code == ErrorCode.none
    assert (created.principal_type, created.principal_name) == ("User", "alice")
    assert created.token_requester_principal_name == "alice" and created.hmac and created.token_id
    assert created.issue_timestamp <= created.expiry_timestamp <= created.max_timestamp

    # a client logs in with the token (both SCRAM mechanisms) and is served as alice
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        (md,) = _call(token_cluster, _token_login(created.token_id, created.hmac, mechanism), _metadata())
        assert [b.node_id for b in md.brokers] == [1]
        # ... but a token session may not make, renew or look at tokens
        refused = _call(
            token_cluster,
            _token_login(created.token_id, created.hmac, mechanism),
            _create(),
            _renew(created.hmac, 60_000),
            _describe(),
        )
        assert [r.error_code for r in refused] == [ErrorCode.delegation_token_request_not_allowed] * 3
    with pytest.raises(KafkaClientError) as wrong:
        _call(token_cluster, _token_login(created.token_id, b"not-the-hmac"), _metadata())
    assert wrong.value.code == ErrorCode.sasl_authentication_failed
    with pytest.raises(KafkaClientError):  # the token id is not a user name without tokenauth
        _call(
            token_cluster,
            ClientSecurity(
                "SASL_PLAINTEXT",
                None,
                "SCRAM-SHA-256",
                lambda: (created.token_id, base64.b64encode(created.hmac).decode()),
            ),
            _metadata(),
        )

    # owner and renewer see it; a filter on another owner does not
    (mine,) = _call(token_cluster, _sasl("alice"), _describe())
    (described,) = [t for t in mine.tokens if t.token_id == created.token_id]
    assert [(r.principal_type, r.principal_name) for r in described.renewers] == [("User", "bob")]
    assert described.hmac == created.hmac
    (bobs,) = _call(token_cluster, _sasl("bob"), _describe(owners=["alice"]))
    assert [t.token_id for t in bobs.tokens] == [created.token_id]
    (none,) = _call(token_cluster, _sasl("alice"), _describe(owners=["carol"]))
    assert none.tokens == ()

    # the renewer renews: now + the period (here past the first expiry), never past the max
    (renewed,) = _call(token_cluster, _sasl("bob"), _renew(created.hmac, 48 * 3_600_000))
    assert renewed.error_code == ErrorCode.none
    assert created.expiry_timestamp < renewed.expiry_timestamp <= created.max_timestamp
    (unknown,) = _call(token_cluster, _sasl("bob"), _renew(b"x" * 64, 1000))
    assert unknown.error_code == ErrorCode.delegation_token_not_found

    # expired now by its owner: no more logins, no longer described
    (expired,) = _call(token_cluster, _sasl("alice"), _expire(created.hmac, -1))
    assert expired.error_code == ErrorCode.none
    with pytest.raises(KafkaClientError):
        _call(token_cluster, _token_login(created.token_id, created.hmac), _metadata())
    (after,) = _call(token_cluster, _sasl("alice"), _describe())
    assert created.token_id not in [t.token_id for t in after.tokens]
    (gone,) = _call(token_cluster, _sasl("alice"), _renew(created.hmac, 1000))
    assert gone.error_code == ErrorCode.delegation_token_not_found


def test_token_for_another_owner_needs_create_tokens(token_cluster):
    """KIP-373: bob may create a token owned by alice only with CREATE_TOKENS on USER User:alice;
    he then sees it as its requester, and alice as its owner."""
    from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
    from kio.static.primitive import i8

    (denied,) = _call(token_cluster, _sasl("bob"), _create(owner="alice"))
    assert denied.error_code == ErrorCode.delegation_token_authorization_failed
    acl = AclCreation(
        resource_type=i8(7),  # USER
        resource_name="User:alice",
        resource_pattern_type=i8(3),  # LITERAL
        principal="User:bob",
        host="*",
        operation=i8(13),  # CREATE_TOKENS
        permission_type=i8(3),  # ALLOW
    )
    (acls,) = _call(token_cluster, _sasl("alice"), CreateAclsRequest(creations=(acl,)))
    assert [r.error_code for r in acls.results] == [ErrorCode.none]
    (made,) = _call(token_cluster, _sasl("bob"), _create(owner="alice"))
    assert made.error_code == ErrorCode.none
    assert (made.principal_name, made.token_requester_principal_name) == ("alice", "bob")
    for user in ("alice", "bob"):
        (seen,) = _call(token_cluster, _sasl(user), _describe())
        assert made.token_id in [t.token_id for t in seen.tokens]
    # a client logs in with it (served as alice, its owner)
    (md,) = _call(token_cluster, _token_login(made.token_id, made.hmac), _metadata())
    assert md.brokers


def test_token_refusals(token_cluster, secure_cluster):
    (alices,) = _call(token_cluster, _sasl("alice"), _create())
    # not owner, not renewer
    refused = _call(token_cluster, _sasl("bob"), _renew(alices.hmac, 1000), _expire(alices.hmac, -1))
    assert [r.error_code for r in refused] == [ErrorCode.delegation_token_owner_mismatch] * 2
    # another owner than the requester needs a super user (with an authorizer); renewers must be users
    from kio.schema.create_delegation_token.v3.request import CreatableRenewers, CreateDelegationTokenRequest

    group_renewer = CreateDelegationTokenRequest(
        owner_principal_type=None,
        owner_principal_name=None,
        renewers=(CreatableRenewers(principal_type="Group", principal_name="ops"),),
        max_lifetime=datetime.timedelta(milliseconds=-1),
    )
    (bad,) = _call(token_cluster, _sasl("alice"), group_renewer)
    assert bad.error_code == ErrorCode.invalid_principal_type
    # an unauthenticated channel may not deal in tokens
    (plain,) = _call(token_cluster, PLAINTEXT, _create(), listener="INTERNAL")
    assert plain.error_code == ErrorCode.delegation_token_request_not_allowed
    # a broker without the secret key has tokens disabled
    (disabled,) = _call(secure_cluster, _sasl("alice"), _create())
    assert disabled.error_code == ErrorCode.delegation_token_auth_disabled


def test_tokens_survive_a_snapshot_and_leave_no_secret_in_metadata():
    import json

    from automq.broker.controller import records as r
    from automq.broker.controller.state import MetadataState

    st = MetadataState()
    st.apply(r.DelegationTokenCreated("tok1", "User:alice", "User:alice", ["User:bob"], 1, 100, 1000))
    st.apply(r.DelegationTokenCreated("tok2", "User:bob", "User:bob", [], 2, 200, 2000))
    st.apply(r.DelegationTokenRenewed("tok1", 500))
    st.apply(r.DelegationTokenRemoved("tok2"))
    snapshot = json.loads(json.dumps(st.snapshot()))
    again = MetadataState.from_snapshot(snapshot)
    (token,) = again.image().delegation_tokens
    assert (token.token_id, token.owner, token.renewers, token.expiry_ms, token.max_ms) == (
        "tok1",
        "User:alice",
        ("User:bob",),
        500,
        1000,
    )
    assert "hmac" not in json.dumps(snapshot).lower()


def test_expired_tokens_leave_the_metadata():
    from automq.broker.controller import records as r
    from automq.broker.controller import users
    from automq.broker.controller.commands import Tx
    from automq.broker.controller.state import MetadataState

    st = MetadataState()
    st.apply(r.DelegationTokenCreated("old", "User:a", "User:a", [], 1, 100, 1000))
    st.apply(r.DelegationTokenCreated("live", "User:a", "User:a", [], 1, 10_000, 20_000))
    emitted: list = []
    assert users.remove_expired_delegation_tokens(Tx(st, 5_000, emitted)) == 1
    assert emitted == [r.DelegationTokenRemoved("old")]


def test_client_properties_for_a_token():
    from automq.broker.config import ConfigError
    from automq.broker.security.client import from_properties

    jaas = (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="id" password="h" tokenauth="true";'
    )
    sec = from_properties(
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas}
    )
    assert sec.token_auth and sec.credentials is not None and sec.credentials() == ("id", "h")
    with pytest.raises(ConfigError, match="SCRAM"):
        from_properties({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas})


def test_tokens_cli(token_cluster, tmp_path):
    """`automq tokens` (kafka-delegation-tokens.sh's commands) with SASL client properties; the
    printed HMAC logs a client in."""
    import json
    import subprocess
    import sys

    props = tmp_path / "alice.properties"
    props.write_text(
        f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=alice\nsasl.password={USERS['alice']}\n"
    )
    common = ["-b", token_cluster.bootstrap("SASL"), "--command-config", str(props)]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "automq.broker.cli", "tokens", *args], capture_output=True, text=True, timeout=60
        )

    made = cli("create", "--renewer", "User:bob", "-o", "json", *common)
    assert made.returncode == 0, made.stderr
    (token,) = json.loads(made.stdout)
    assert token["owner"] == "User:alice" and token["renewers"] == ["User:bob"]
    (md,) = _call(token_cluster, _token_login(token["token_id"], base64.b64decode(token["hmac"])), _metadata())
    assert md.brokers
    listed = cli("describe", "-o", "json", *common)
    assert token["token_id"] in [t["token_id"] for t in json.loads(listed.stdout)], listed.stderr
    renewed = cli("renew", "--hmac", token["hmac"], "--renew-time-period-ms", "60000", *common)
    assert renewed.returncode == 0 and renewed.stdout.startswith("renewed"), renewed.stderr
    expired = cli("expire", "--hmac", token["hmac"], *common)
    assert expired.returncode == 0 and expired.stdout.strip() == "expired", expired.stderr
    again = cli("renew", "--hmac", token["hmac"], *common)
    assert again.returncode == 1 and "DELEGATION_TOKEN_NOT_FOUND" in again.stderr, again.stderr
    assert cli("renew", "--hmac", "%%%", *common).returncode == 2
    # on a PLAINTEXT listener: Kafka's refusal, one line
    plain = cli("describe", "-b", token_cluster.bootstrap("INTERNAL"))
    assert plain.returncode == 1 and "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED" in plain.stderr, plain.stderr
