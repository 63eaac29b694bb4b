"""`automq topics ...` and `automq groups ...`: typer sub-apps over `AdminClient`.

Every command takes `--bootstrap` (default: the local cluster in `--data-dir`, else
127.0.0.1:9092), `--command-config FILE` (TLS / SASL client properties, as Kafka's tools) and
`--output table|json`; errors print one line naming the Kafka error and
exit 1, bad usage exits 2.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

if TYPE_CHECKING:  # the client (kio) is imported when a command runs: `automq --help` stays instant
    from automq.broker.admin.kafka import AdminClient, GroupDetail, TopicDetail
    from automq.broker.security.client import ClientSecurity

T = TypeVar("T")

topics_app = typer.Typer(help="List, describe, create, delete and configure topics.", no_args_is_help=True)
groups_app = typer.Typer(
    help="List and describe groups: classic, KIP-848 and share groups (members, epochs, offsets, lag).",
    no_args_is_help=True,
)

BOOTSTRAP = typer.Option(None, "--bootstrap", "-b", help="HOST:PORT; default: the local cluster in --data-dir.")
COMMAND_CONFIG = typer.Option(
    None,
    "--command-config",
    help="Client properties (security.protocol, sasl.mechanism, sasl.jaas.config or sasl.username/sasl.password, "
    "ssl.ca.location, ...) as Kafka's tools take them; default: a --secure local cluster's own settings.",
)
DATA_DIR = typer.Option(Path(".automq-local"), "--data-dir", help="A local cluster's data dir.")
OUTPUT = typer.Option("table", "--output", "-o", help="table or json.")


def local_bootstrap(data_dir: Path) -> str | None:
    """The brokers' Kafka addresses of a cluster `automq local up` made in `data_dir`."""
    from automq.broker.config import ConfigError, load_config

    addresses = []
    for path in sorted((data_dir / "config").glob("broker-*.yaml")):
        try:
            config = load_config(path)
        except ConfigError:
            continue
        addresses += [f"{listener.host}:{listener.port}" for listener in config.listeners[:1]]
    return ",".join(addresses) or None


def client_security(command_config: Path | None, data_dir: Path | None = None) -> ClientSecurity:
    """Security of the admin connections: --command-config, else a `local up --secure` cluster's
    own settings when `data_dir` is one, else PLAINTEXT. ConfigError names what is wrong."""
    from automq.broker.security import client

    if command_config is not None:
        return client.from_properties(client.read_properties(command_config))
    if data_dir is not None and (data_dir / "secure" / "ca.crt").exists() and local_bootstrap(data_dir):
        from automq.broker.local_secure import SecureLocal

        lines = SecureLocal(data_dir / "secure").client_settings("").splitlines()
        props = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
        return client.from_properties(props, f"{data_dir / 'secure'}")
    return client.PLAINTEXT


def _run(
    bootstrap: str | None,
    command_config: Path | None,
    data_dir: Path,
    output: str,
    call: Callable[[AdminClient], Awaitable[T]],
) -> T:
    if output not in ("table", "json"):
        typer.echo(f"--output must be table or json, got {output!r}", err=True)
        raise typer.Exit(2)
    from automq.broker.admin.kafka import AdminClient
    from automq.broker.balancer.kafka_admin import KafkaAdminError
    from automq.broker.config import ConfigError

    address = bootstrap or local_bootstrap(data_dir) or "127.0.0.1:9092"
    try:
        security = client_security(command_config, None if bootstrap else data_dir)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None

    async def go() -> T:
        admin = AdminClient(address, timeout_s=15.0, security=security)
        try:
            return await call(admin)
        finally:
            await admin.close()

    try:
        return asyncio.run(go())
    except ValueError as exc:  # a malformed bootstrap
        typer.echo(f"--bootstrap: {exc}", err=True)
        raise typer.Exit(2) from None
    except KafkaAdminError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _json(value: Any) -> None:
    def plain(v: Any) -> Any:
        return asdict(v) if is_dataclass(v) and not isinstance(v, type) else v

    data = [plain(v) for v in value] if isinstance(value, list) else plain(value)
    typer.echo(json.dumps(data, indent=2))


def _table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns, title=title, title_justify="left")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    Console().print(table)


def _pairs(items: list[str], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.echo(f"{option} {item!r}: expected KEY=VALUE", err=True)
            raise typer.Exit(2)
        out[key] = value
    return out


# ---------------------------------------------------------------------------- topics


@topics_app.command("list")
def topics_list(
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
    internal: bool = typer.Option(False, "--internal", help="Include internal topics (__consumer_offsets)."),
) -> None:
    """Topics and their partition counts."""
    topics = _run(bootstrap, command_config, data_dir, output, lambda a: a.list_topics(include_internal=internal))
    if output == "json":
        _json(topics)
    else:
        _table(None, ["topic", "partitions", "internal"], [[t.name, t.partitions, t.internal] for t in topics])


@topics_app.command("describe")
def topics_describe(
    name: str = typer.Argument(..., help="Topic name."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
) -> None:
    """Partitions (leader, start and end offsets) and the configs set on the topic."""
    detail: TopicDetail = _run(bootstrap, command_config, data_dir, output, lambda a: a.describe_topic(name))
    if output == "json":
        _json(detail)
        return
    typer.echo(f"topic {detail.name} (id {detail.topic_id}), {len(detail.partitions)} partitions")
    _table(
        None,
        ["partition", "leader", "start offset", "end offset", "records", "error"],
        [
            [p.partition, p.leader, p.start_offset, p.end_offset, max(0, p.end_offset - p.start_offset), p.error]
            for p in detail.partitions
        ],
    )
    if detail.configs:
        _table("configs set on the topic", ["key", "value"], [[k, v] for k, v in detail.configs.items()])


@topics_app.command("create")
def topics_create(
    name: str = typer.Argument(..., help="Topic name."),
    partitions: int = typer.Option(1, "--partitions", "-p", min=1, help="Number of partitions."),
    config: list[str] | None = typer.Option(None, "--config", "-c", help="KEY=VALUE topic config (repeatable)."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
) -> None:
    """Create a topic (one replica per partition: durability comes from the WAL and object store)."""
    configs = _pairs(config or [], "--config")
    _run(bootstrap, command_config, data_dir, "table", lambda a: a.create_topic(name, partitions, configs))
    typer.echo(f"created topic {name} with {partitions} partition(s)")


@topics_app.command("delete")
def topics_delete(
    name: str = typer.Argument(..., help="Topic name."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
) -> None:
    """Delete a topic and its data."""
    _run(bootstrap, command_config, data_dir, "table", lambda a: a.delete_topic(name))
    typer.echo(f"deleted topic {name}")


@topics_app.command("alter-config")
def topics_alter_config(
    name: str = typer.Argument(..., help="Topic name."),
    set_: list[str] | None = typer.Option(None, "--set", help="KEY=VALUE to set (repeatable)."),
    delete: list[str] | None = typer.Option(None, "--delete", help="KEY to reset to the default (repeatable)."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
) -> None:
    """Set or reset topic configs (IncrementalAlterConfigs)."""
    values = _pairs(set_ or [], "--set")
    if not values and not delete:
        typer.echo("nothing to change: give --set KEY=VALUE and/or --delete KEY", err=True)
        raise typer.Exit(2)
    _run(bootstrap, command_config, data_dir, "table", lambda a: a.alter_topic_config(name, values, delete or []))
    typer.echo(f"altered configs of {name}")


# ---------------------------------------------------------------------------- groups


@groups_app.command("list")
def groups_list(
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
    type_: list[str] | None = typer.Option(
        None,
        "--type",
        "-t",
        help="Only groups of this type: classic, consumer (KIP-848) or share (KIP-932); repeatable.",
    ),
) -> None:
    """Groups with their type (classic, consumer: KIP-848, share: KIP-932), state and coordinator."""
    types = [t.lower() for t in type_ or []]
    bad = [t for t in types if t not in ("classic", "consumer", "share")]
    if bad:
        typer.echo(f"--type must be classic, consumer or share, got {bad[0]!r}", err=True)
        raise typer.Exit(2)
    groups = _run(bootstrap, command_config, data_dir, output, lambda a: a.list_groups(types))
    if output == "json":
        _json(groups)
    else:
        _table(
            None,
            ["group", "type", "state", "protocol type", "coordinator"],
            [[g.group_id, g.type, g.state, g.protocol_type, g.coordinator] for g in groups],
        )


@groups_app.command("describe")
def groups_describe(
    group: str = typer.Argument(..., help="Group id."),
    bootstrap: str | None = BOOTSTRAP,
    command_config: Path | None = COMMAND_CONFIG,
    data_dir: Path = DATA_DIR,
    output: str = OUTPUT,
) -> None:
    """Members and their partitions, committed offsets, end offsets and lag per partition."""
    detail: GroupDetail = _run(bootstrap, command_config, data_dir, output, lambda a: a.describe_group(group))
    if output == "json":
        data = asdict(detail)
        data["total_lag"] = detail.total_lag
        typer.echo(json.dumps(data, indent=2))
        return
    if detail.type == "consumer":
        typer.echo(
            f"group {detail.group_id} (consumer protocol, KIP-848): {detail.state}, "
            f"group epoch {detail.group_epoch}, assignment epoch {detail.assignment_epoch}, "
            f"assignor {detail.assignor or '-'}, coordinator {detail.coordinator}, "
            f"{len(detail.members)} member(s), total lag {detail.total_lag}"
        )
        _table(
            "members",
            ["member", "epoch", "client", "host", "assigned", "target"],
            [
                [m.member_id, m.member_epoch, m.client_id, m.host, _partitions(m.assignment), _partitions(m.target)]
                for m in detail.members
            ],
        )
    elif detail.type == "share":
        typer.echo(
            f"group {detail.group_id} (share group, KIP-932): {detail.state}, "
            f"group epoch {detail.group_epoch}, assignment epoch {detail.assignment_epoch}, "
            f"assignor {detail.assignor or '-'}, coordinator {detail.coordinator}, "
            f"{len(detail.members)} member(s), total lag {detail.total_lag}"
        )
        _table(
            "members",
            ["member", "epoch", "client", "host", "assigned"],
            [[m.member_id, m.member_epoch, m.client_id, m.host, _partitions(m.assignment)] for m in detail.members],
        )
        _table(
            "share-partitions",
            ["topic", "partition", "start offset", "end", "lag", "members"],
            [[o.topic, o.partition, o.committed, o.end_offset, o.lag, o.owner] for o in detail.offsets],
        )
        return
    else:
        typer.echo(
            f"group {detail.group_id} (classic): {detail.state}, "
            f"protocol {detail.protocol_type or '-'}/{detail.protocol or '-'}, "
            f"coordinator {detail.coordinator}, {len(detail.members)} member(s), total lag {detail.total_lag}"
        )
        _table(
            "members",
            ["member", "client", "host", "partitions"],
            [[m.member_id, m.client_id, m.host, _partitions(m.assignment)] for m in detail.members],
        )
    _table(
        "offsets",
        ["topic", "partition", "committed", "end", "lag", "member"],
        [[o.topic, o.partition, o.committed, o.end_offset, o.lag, o.owner] for o in detail.offsets],
    )


def _partitions(pairs: list[tuple[str, int]] | None) -> str:
    return ", ".join(f"{t}-{p}" for t, p in pairs or ()) or "-"
