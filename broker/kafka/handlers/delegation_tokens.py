"""CreateDelegationToken, RenewDelegationToken, ExpireDelegationToken, DescribeDelegationToken
(KIP-48, KIP-373), as a Java broker answers them. Tokens are stored in the controller's
metadata (no secret there); the HMAC is derived by every broker (`security/tokens.py`).

Kafka's rules: without `security.delegation_token_secret_key_file` every call answers
DELEGATION_TOKEN_AUTH_DISABLED; tokens are created, renewed, expired and described only on an
authenticated channel (SASL, or SSL with a client certificate) and never on one that logged in
with a token (DELEGATION_TOKEN_REQUEST_NOT_ALLOWED); creating a token for another owner (v3)
needs CREATE_TOKENS on that USER (DELEGATION_TOKEN_AUTHORIZATION_FAILED); a token is described
to its owner, requester and renewers, and to principals with DESCRIBE on the DELEGATION_TOKEN or
DESCRIBE_TOKENS on its owner's USER (everyone, with no authorizer); only the owner or a renewer may
renew or expire (DELEGATION_TOKEN_OWNER_MISMATCH); an unknown HMAC is
DELEGATION_TOKEN_NOT_FOUND, a lapsed token DELEGATION_TOKEN_EXPIRED; renewers must be `User`
principals (INVALID_PRINCIPAL_TYPE). A token past its expiry is refused for logins and left
out of descriptions; an expire with a negative period removes it at once.
"""

from __future__ import annotations

import datetime
import secrets
import time

from kio.schema.errors import ErrorCode

from automq.broker.controller.acls import AclOperation, ResourceType
from automq.broker.controller.protocol import DelegationTokenInfo
from automq.broker.kafka import authorizer as authz
from automq.broker.kafka import codec
from automq.broker.kafka.context import RequestContext
from automq.broker.kafka.handlers.admin import _controller
from automq.broker.kafka.handlers.registry import handles
from automq.broker.security.principal import ANONYMOUS

CREATE, RENEW, EXPIRE, DESCRIBE = 38, 39, 40, 41
VISIBLE_WAIT_S = 5.0
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _ts(ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _refusal(ctx: RequestContext) -> ErrorCode | None:
    if not ctx.broker.tokens.enabled:
        return ErrorCode.delegation_token_auth_disabled
    session = ctx.session
    if (
        session is None
        or ctx.security_protocol == "PLAINTEXT"
        or ctx.principal == ANONYMOUS
        or session.token_authenticated
    ):
        return ErrorCode.delegation_token_request_not_allowed
    return None


def _split(principal: str) -> tuple[str, str]:
    kind, _, name = principal.partition(":")
    return kind, name


async def _visible(ctx: RequestContext, predicate) -> None:
    """Answer once this broker's image shows the change (a client may log in with the token
    right away, here or elsewhere)."""
    await ctx.broker.partitions.wait_for_image(lambda img: predicate(img.delegation_tokens), VISIBLE_WAIT_S)


@handles(CREATE)
async def create_delegation_token(request, ctx: RequestContext):
    def answer(error: ErrorCode, **values):
        base = {
            "error_code": error,
            "principal_type": "User",
            "principal_name": "",
            "token_requester_principal_type": "User",
            "token_requester_principal_name": "",
            "issue_timestamp": _EPOCH,
            "expiry_timestamp": _EPOCH,
            "max_timestamp": _EPOCH,
            "token_id": "",
            "hmac": b"",
            "throttle_time": datetime.timedelta(0),
        }
        return codec.build(ctx.response_class, **{**base, **values})

    refused = _refusal(ctx)
    if refused is not None:
        return answer(refused)
    owner = ctx.principal
    owner_name = getattr(request, "owner_principal_name", None)
    if owner_name:
        owner_type = getattr(request, "owner_principal_type", None) or "User"
        if owner_type != "User":
            return answer(ErrorCode.invalid_principal_type)
        owner = f"{owner_type}:{owner_name}"
        if owner != ctx.principal and not authz.allowed(ctx, AclOperation.CREATE_TOKENS, ResourceType.USER, owner):
            return answer(ErrorCode.delegation_token_authorization_failed)
    renewers = []
    for r in request.renewers:
        if r.principal_type != "User":
            return answer(ErrorCode.invalid_principal_type)
        renewers.append(f"{r.principal_type}:{r.principal_name}")
    tokens = ctx.broker.tokens
    now = _now_ms()
    asked_ms = int(request.max_lifetime.total_seconds() * 1000)
    lifetime = min(asked_ms, tokens.max_lifetime_ms) if asked_ms > 0 else tokens.max_lifetime_ms
    max_ms = now + lifetime
    info = DelegationTokenInfo(
        secrets.token_urlsafe(16),
        owner,
        ctx.principal,
        tuple(renewers),
        now,
        min(now + tokens.expiry_time_ms, max_ms),
        max_ms,
    )
    await _controller(ctx.broker.cluster.create_delegation_token(info))  # type: ignore[attr-defined]
    await _visible(ctx, lambda ts: any(t.token_id == info.token_id for t in ts))
    return answer(
        ErrorCode.none,
        principal_type=_split(owner)[0],
        principal_name=_split(owner)[1],
        token_requester_principal_type=_split(ctx.principal)[0],
        token_requester_principal_name=_split(ctx.principal)[1],
        issue_timestamp=_ts(info.issue_ms),
        expiry_timestamp=_ts(info.expiry_ms),
        max_timestamp=_ts(info.max_ms),
        token_id=info.token_id,
        hmac=tokens.hmac(info.token_id),
    )


async def _change_expiry(request, ctx: RequestContext, period_ms: int, renew: bool):
    def answer(error: ErrorCode, expiry_ms: int = -1):
        return codec.build(
            ctx.response_class,
            error_code=error,
            expiry_timestamp=_ts(max(expiry_ms, 0)),
            throttle_time=datetime.timedelta(0),
        )

    refused = _refusal(ctx)
    if refused is not None:
        return answer(refused)
    token = ctx.broker.tokens.find(request.hmac)
    if token is None:
        return answer(ErrorCode.delegation_token_not_found)
    if ctx.principal != token.owner and ctx.principal not in token.renewers:
        return answer(ErrorCode.delegation_token_owner_mismatch)
    now = _now_ms()
    if token.expiry_ms < now:
        return answer(ErrorCode.delegation_token_expired)
    if renew:
        expiry: int | None = min(
            now + (period_ms if period_ms >= 0 else ctx.broker.tokens.expiry_time_ms), token.max_ms
        )
    else:
        expiry = None if period_ms < 0 else min(now + period_ms, token.max_ms)
    found = await _controller(ctx.broker.cluster.set_delegation_token_expiry(token.token_id, expiry))  # type: ignore[attr-defined]
    if not found:
        return answer(ErrorCode.delegation_token_not_found)
    if expiry is None:
        await _visible(ctx, lambda ts: all(t.token_id != token.token_id for t in ts))
        return answer(ErrorCode.none, now)
    await _visible(ctx, lambda ts: any(t.token_id == token.token_id and t.expiry_ms == expiry for t in ts))
    return answer(ErrorCode.none, expiry)


@handles(RENEW)
async def renew_delegation_token(request, ctx: RequestContext):
    return await _change_expiry(request, ctx, int(request.renew_period.total_seconds() * 1000), renew=True)


@handles(EXPIRE)
async def expire_delegation_token(request, ctx: RequestContext):
    return await _change_expiry(request, ctx, int(request.expiry_time_period.total_seconds() * 1000), renew=False)


@handles(DESCRIBE)
async def describe_delegation_token(request, ctx: RequestContext):
    token_cls = codec.nested(ctx.response_class, "DescribedDelegationToken")
    renewer_cls = codec.nested(ctx.response_class, "DescribedDelegationTokenRenewer")
    refused = _refusal(ctx)
    if refused is not None:
        return codec.build(ctx.response_class, error_code=refused, tokens=(), throttle_time=datetime.timedelta(0))
    tokens = ctx.broker.tokens
    owners = None if request.owners is None else {f"{o.principal_type}:{o.principal_name}" for o in request.owners}
    now = _now_ms()
    out = []
    for t in sorted(tokens.tokens.values(), key=lambda t: t.issue_ms):
        if t.expiry_ms < now or (owners is not None and t.owner not in owners):
            continue
        if not (
            ctx.principal in (t.owner, t.requester, *t.renewers)
            or authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.DELEGATION_TOKEN, t.token_id)
            or authz.allowed(ctx, AclOperation.DESCRIBE_TOKENS, ResourceType.USER, t.owner)
        ):
            continue  # as Kafka's filterToken (with no authorizer, every authenticated user sees all)
        out.append(
            codec.build(
                token_cls,
                principal_type=_split(t.owner)[0],
                principal_name=_split(t.owner)[1],
                token_requester_principal_type=_split(t.requester)[0],
                token_requester_principal_name=_split(t.requester)[1],
                issue_timestamp=t.issue_ms,  # milliseconds here (datetimes in Create/Renew/Expire)
                expiry_timestamp=t.expiry_ms,
                max_timestamp=t.max_ms,
                token_id=t.token_id,
                hmac=tokens.hmac(t.token_id),
                renewers=tuple(
                    codec.build(renewer_cls, principal_type=_split(r)[0], principal_name=_split(r)[1])
                    for r in t.renewers
                ),
            )
        )
    return codec.build(
        ctx.response_class, error_code=ErrorCode.none, tokens=tuple(out), throttle_time=datetime.timedelta(0)
    )
