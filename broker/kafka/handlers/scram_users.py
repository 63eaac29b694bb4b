"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): SCRAM users kept in
the controller's metadata, so `kafka-configs --alter --add-config SCRAM-SHA-512=...` and
confluent-kafka's AdminClient manage them.

An admin client sends SaltedPassword = Hi(password, salt, iterations); the broker derives
StoredKey and ServerKey from it and only those reach the controller. Errors per user, as a
Java broker answers: UNACCEPTABLE_CREDENTIAL (empty name, iterations outside 4096..16384, empty
salt or password), UNSUPPORTED_SASL_MECHANISM, DUPLICATE_RESOURCE (a user/mechanism twice),
RESOURCE_NOT_FOUND (deleting or describing what does not exist). The answer comes once this
broker's metadata shows the change, so a client can authenticate with it at once.
"""

from __future__ import annotations

import base64
import collections
import logging

from kio.schema.errors import ErrorCode

from automq.broker.controller.protocol import MetadataImage, ScramCredentialInfo
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.admin import _controller, _fresh_image, error_of
from automq.broker.kafka.handlers.registry import handles
from automq.broker.security import scram

log = logging.getLogger(__name__)

DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51
MECHANISM_BY_TYPE = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism ids
TYPE_BY_MECHANISM = {v: k for k, v in MECHANISM_BY_TYPE.items()}


@handles(DESCRIBE_USER_SCRAM_CREDENTIALS)
async def describe_user_scram_credentials(request, ctx: RequestContext):
    if not authz.cluster_allowed(ctx, authz.Op.DESCRIBE):
        return codec.build(
            ctx.response_class,
            throttle_time=codec.ZERO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message="DESCRIBE on the cluster is required",
            results=(),
        )
    image = await _fresh_image(ctx) or ctx.broker.metadata
    by_user: dict[str, list[ScramCredentialInfo]] = collections.defaultdict(list)
    for c in image.scram_credentials if image is not None else ():
        by_user[c.user].append(c)
    result_cls = codec.nested(ctx.response_class, "DescribeUserScramCredentialsResult")
    info_cls = codec.nested(ctx.response_class, "CredentialInfo")

    def infos(user: str):
        return tuple(info_cls(mechanism=TYPE_BY_MECHANISM[c.mechanism], iterations=c.iterations) for c in by_user[user])

    results = []
    if not request.users:  # null or empty: every user
        results = [
            result_cls(user=u, error_code=ErrorCode.none, error_message=None, credential_infos=infos(u))
            for u in sorted(by_user)
        ]
    else:
        counts = collections.Counter(u.name for u in request.users)
        for name in dict.fromkeys(u.name for u in request.users):
            if counts[name] > 1:
                results.append(
                    result_cls(
                        user=name,
                        error_code=ErrorCode.duplicate_resource,
                        error_message=f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}",
                        credential_infos=(),
                    )
                )
            elif name not in by_user:
                results.append(
                    result_cls(
                        user=name,
                        error_code=ErrorCode.resource_not_found,
                        error_message=f"Attempt to describe a user credential that does not exist: {name}",
                        credential_infos=(),
                    )
                )
            else:
                results.append(
                    result_cls(user=name, error_code=ErrorCode.none, error_message=None, credential_infos=infos(name))
                )
    return codec.build(
        ctx.response_class,
        throttle_time=codec.ZERO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(results),
    )


def _check(name: str, mechanism_type: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism_type not in MECHANISM_BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


@handles(ALTER_USER_SCRAM_CREDENTIALS)
async def alter_user_scram_credentials(request, ctx: RequestContext):
    errors: dict[str, tuple[ErrorCode, str]] = {}
    if not authz.cluster_allowed(ctx, authz.Op.ALTER):
        for name in [d.name for d in request.deletions] + [u.name for u in request.upsertions]:
            errors[name] = (ErrorCode.cluster_authorization_failed, "ALTER on the cluster is required")
    seen: collections.Counter[tuple[str, int]] = collections.Counter(
        [(d.name, int(d.mechanism)) for d in request.deletions]
        + [(u.name, int(u.mechanism)) for u in request.upsertions]
    )
    order = list(dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions]))
    for (name, _mech), count in seen.items():
        if count > 1:
            errors.setdefault(
                name,
                (
                    ErrorCode.duplicate_resource,
                    f"A user credential cannot be altered twice in the same request: {name}",
                ),
            )
    for d in request.deletions:
        problem = _check(d.name, int(d.mechanism))
        if problem:
            errors.setdefault(d.name, problem)
    upserts: list[ScramCredentialInfo] = []
    for u in request.upsertions:
        problem = _check(u.name, int(u.mechanism))
        if problem is None:
            if not scram.MIN_ITERATIONS <= u.iterations <= scram.MAX_ITERATIONS:
                word = "few" if u.iterations < scram.MIN_ITERATIONS else "many"
                problem = (
                    ErrorCode.unacceptable_credential,
                    f"Too {word} iterations ({u.iterations}): {scram.MIN_ITERATIONS}..{scram.MAX_ITERATIONS}",
                )
            elif not u.salt:
                problem = (ErrorCode.unacceptable_credential, "Salt must not be empty")
            elif not u.salted_password:
                problem = (ErrorCode.unacceptable_credential, "Salted password must not be empty")
        if problem:
            errors.setdefault(u.name, problem)
            continue
        mechanism = MECHANISM_BY_TYPE[int(u.mechanism)]
        cred = scram.credential_from_salted(mechanism, bytes(u.salted_password), bytes(u.salt), u.iterations)
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        upserts.append(
            ScramCredentialInfo(
                u.name, mechanism, b64(cred.salt), cred.iterations, b64(cred.stored_key), b64(cred.server_key)
            )
        )
    deletions = [(d.name, MECHANISM_BY_TYPE[int(d.mechanism)]) for d in request.deletions if d.name not in errors]
    upserts = [c for c in upserts if c.user not in errors]
    if deletions or upserts:
        try:
            applied = await _controller(ctx.broker.cluster.alter_scram_credentials(deletions, upserts))  # type: ignore[attr-defined]
        except Exception as exc:
            code, message = error_of(exc)
            for name in order:
                errors.setdefault(name, (code, message or ""))
        else:
            for name, problem in applied.items():
                if problem is not None:
                    errors.setdefault(
                        name, (getattr(ErrorCode, problem[0].lower(), ErrorCode.unknown_server_error), problem[1])
                    )
            await _wait_visible(
                ctx, [d for d in deletions if d[0] not in errors], [c for c in upserts if c.user not in errors]
            )
    result_cls = codec.nested(ctx.response_class, "AlterUserScramCredentialsResult")
    results = tuple(
        result_cls(
            user=name,
            error_code=errors[name][0] if name in errors else ErrorCode.none,
            error_message=errors[name][1] if name in errors else None,
        )
        for name in order
    )
    return codec.build(ctx.response_class, throttle_time=codec.ZERO_THROTTLE, results=results)


async def _wait_visible(
    ctx: RequestContext, deletions: list[tuple[str, str]], upserts: list[ScramCredentialInfo]
) -> None:
    def shows(image: MetadataImage) -> bool:
        current = {(c.user, c.mechanism): c for c in image.scram_credentials}
        return all(current.get((c.user, c.mechanism)) == c for c in upserts) and not any(
            d in current for d in deletions
        )

    image = await ctx.broker.partitions.wait_for_image(shows, 5.0)
    if image is None:
        log.warning("AlterUserScramCredentials: the change is not in this broker's metadata after 5 s")
