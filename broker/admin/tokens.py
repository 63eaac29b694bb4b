"""`automq tokens create|describe|renew|expire`: what Kafka's `kafka-delegation-tokens.sh` does,
over the Kafka protocol (Create/Describe/Renew/ExpireDelegationToken). Tokens are created on
an authenticated connection, so these commands take `--command-config` (SASL or mTLS client
properties); the HMAC is printed base64, as the Java tool prints it and as a client gives it
as its SCRAM password (user = token id, `tokenauth="true"`).
"""

from __future__ import annotations

import base64
import binascii
import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from automq.broker.admin.cli import BOOTSTRAP, COMMAND_CONFIG, DATA_DIR, OUTPUT, _json, _run, _table

if TYPE_CHECKING:
    from automq.broker.admin.kafka import AdminClient

tokens_app = typer.Typer(help="Create, describe, renew and expire delegation tokens.", no_args_is_help=True)


@dataclass(frozen=True)
class TokenDetail:
    token_id: str
    hmac: str  # base64
    owner: str
    requester: str
    renewers: list[str]
    issue_ms: int
    expiry_ms: int
    max_ms: int


def _ms(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def _check(code: Any, what: str) -> None:
    from kio.schema.errors import ErrorCode

    from automq.broker.balancer.kafka_admin import KafkaAdminError

    if code != ErrorCode.none:
        raise KafkaAdminError(f"{what}: {code.name.upper()}", code)


def _hmac(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        typer.echo("--hmac: not base64 (give the HMAC as `tokens create` printed it)", err=True)
        raise typer.Exit(2) from None


async def create_token(admin: AdminClient, renewers: list[str], max_lifetime_ms: int) -> TokenDetail:
    from kio.schema.create_delegation_token.v3.request import CreatableRenewers, CreateDelegationTokenRequest
    from kio.static.primitive import i64Timedelta

    request = CreateDelegationTokenRequest(
        owner_principal_type=None,
        owner_principal_name=None,
        renewers=tuple(
            CreatableRenewers(principal_type=r.partition(":")[0], principal_name=r.partition(":")[2]) for r in renewers
        ),
        max_lifetime=i64Timedelta.parse(datetime.timedelta(milliseconds=max_lifetime_ms)),
    )
    r: Any = await admin._any(request)
    _check(r.error_code, "CreateDelegationToken")
    return TokenDetail(
        r.token_id,
        base64.b64encode(r.hmac).decode(),
        f"{r.principal_type}:{r.principal_name}",
        f"{r.token_requester_principal_type}:{r.token_requester_principal_name}",
        list(renewers),
        _ms(r.issue_timestamp),
        _ms(r.expiry_timestamp),
        _ms(r.max_timestamp),
    )


async def describe_tokens(admin: AdminClient, owners: list[str] | None) -> list[TokenDetail]:
    from kio.schema.describe_delegation_token.v3.request import (
        DescribeDelegationTokenOwner,
        DescribeDelegationTokenRequest,
    )

    request = DescribeDelegationTokenRequest(
        owners=None
        if not owners
        else tuple(
            DescribeDelegationTokenOwner(principal_type=o.partition(":")[0], principal_name=o.partition(":")[2])
            for o in owners
        )
    )
    r: Any = await admin._any(request)
    _check(r.error_code, "DescribeDelegationToken")
    return [
        TokenDetail(
            t.token_id,
            base64.b64encode(t.hmac).decode(),
            f"{t.principal_type}:{t.principal_name}",
            f"{t.token_requester_principal_type}:{t.token_requester_principal_name}",
            [f"{x.principal_type}:{x.principal_name}" for x in t.renewers],
            _ms(t.issue_timestamp),
            _ms(t.expiry_timestamp),
            _ms(t.max_timestamp),
        )
        for t in r.tokens
    ]


async def change_expiry(admin: AdminClient, hmac: bytes, period_ms: int, renew: bool) -> int:
    """The new expiry (ms since the epoch)."""
    from kio.static.primitive import i64Timedelta

    if renew:
        from kio.schema.renew_delegation_token.v2.request import RenewDelegationTokenRequest

        request: Any = RenewDelegationTokenRequest(
            hmac=hmac, renew_period=i64Timedelta.parse(datetime.timedelta(milliseconds=period_ms))
        )
    else:
        from kio.schema.expire_delegation_token.v2.request import ExpireDelegationTokenRequest

        request = ExpireDelegationTokenRequest(
            hmac=hmac, expiry_time_period=i64Timedelta.parse(datetime.timedelta(milliseconds=period_ms))
        )
    r: Any = await admin._any(request)
    _check(r.error_code, "RenewDelegationToken" if renew else "ExpireDelegationToken")
    return _ms(r.expiry_timestamp)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")


def _show(tokens: list[TokenDetail], output: str, title: str) -> None:
    if output == "json":
        _json(tokens)
        return
    _table(
        title,
        ["token id", "hmac", "owner", "renewers", "issued", "expires", "max"],
        [
            [t.token_id, t.hmac, t.owner, ",".join(t.renewers), _iso(t.issue_ms), _iso(t.expiry_ms), _iso(t.max_ms)]
            for t in tokens
        ],
    )


@tokens_app.command("create")
def tokens_create(
    renewer: list[str] | None = typer.Option(None, "--renewer", help="User:NAME who may renew it (repeatable)."),
    max_lifetime_ms: int = typer.Option(-1, "--max-lifetime-ms", help="-1: the broker's maximum."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
) -> None:
    """Create a token owned by the authenticated user (Kafka: --create)."""
    for r in renewer or []:
        if not r.startswith("User:") or len(r) == 5:
            typer.echo(f"--renewer {r!r}: expected User:NAME", err=True)
            raise typer.Exit(2)
    token = _run(bootstrap, command_config, data_dir, output, lambda a: create_token(a, renewer or [], max_lifetime_ms))
    _show([token], output, "created delegation token")


@tokens_app.command("describe")
def tokens_describe(
    owner: list[str] | None = typer.Option(None, "--owner", help="Only tokens of User:NAME (repeatable)."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
) -> None:
    """Tokens the authenticated user owns, requested or may renew (Kafka: --describe)."""
    tokens = _run(bootstrap, command_config, data_dir, output, lambda a: describe_tokens(a, owner))
    _show(tokens, output, "delegation tokens")


@tokens_app.command("renew")
def tokens_renew(
    hmac: str = typer.Option(..., "--hmac", help="The token's HMAC, base64."),
    period_ms: int = typer.Option(-1, "--renew-time-period-ms", help="-1: the broker's expiry time."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
) -> None:
    """Push a token's expiry to now + the period (never past its max) (Kafka: --renew)."""
    raw = _hmac(hmac)
    expiry = _run(bootstrap, command_config, data_dir, "table", lambda a: change_expiry(a, raw, period_ms, True))
    typer.echo(f"renewed; expires {_iso(expiry)}")


@tokens_app.command("expire")
def tokens_expire(
    hmac: str = typer.Option(..., "--hmac", help="The token's HMAC, base64."),
    period_ms: int = typer.Option(-1, "--expiry-time-period-ms", help="-1: now (the token is removed)."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
) -> None:
    """Expire a token now, or after the period (Kafka: --expire)."""
    raw = _hmac(hmac)
    expiry = _run(bootstrap, command_config, data_dir, "table", lambda a: change_expiry(a, raw, period_ms, False))
    typer.echo("expired" if period_ms < 0 else f"expires {_iso(expiry)}")
