"""The `automq` command: one entry point for every process the image runs.

    automq local up       a whole cluster on this machine (controller + brokers), embedded object store
    automq broker         a Kafka-protocol broker
    automq controller     the metadata controller
    automq operator       the Kubernetes operator
    automq spark ...      Spark jobs: lake ingestion into Iceberg, object compaction
    automq wal recover    replay a lost broker's volume WAL into the object store (node loss)
    automq rebalance      measure load and move partitions to balance it (any cluster, by bootstrap)
    automq topics ...     list, describe, create, delete, alter-config
    automq groups ...     list, describe (members, offsets, lag)
    automq tokens ...     delegation tokens: create, describe, renew, expire
    automq status         controllers, brokers, partitions, WAL backlog and problems of a running cluster

Each subcommand imports its implementation lazily so that `automq --help` is instant and a
broker image does not import the operator's dependencies.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

app = typer.Typer(
    help="A Kafka-compatible streaming system on object storage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
local_app = typer.Typer(help="Run a whole cluster on this machine.", no_args_is_help=True)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"automq {version('automq-py')}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """A Kafka-compatible streaming system on object storage."""


app.add_typer(local_app, name="local")


def _spark_app() -> typer.Typer:
    from automq.spark.cli import spark_app  # light: the jobs import pyspark only when they run

    return spark_app


app.add_typer(_spark_app(), name="spark")
wal_app = typer.Typer(help="Write-ahead log tools.", no_args_is_help=True)
app.add_typer(wal_app, name="wal")


def _admin_apps() -> None:
    from automq.broker.admin.cli import groups_app, topics_app

    app.add_typer(topics_app, name="topics")
    app.add_typer(groups_app, name="groups")
    from automq.broker.admin.transactions import transactions_app

    app.add_typer(transactions_app, name="transactions")
    from automq.broker.admin.tokens import tokens_app

    app.add_typer(tokens_app, name="tokens")


_admin_apps()


def _load(config: Path):
    from automq.broker.config import ConfigError, load_config
    from automq.broker.objectstore.check import ObjectStoreCheckError, check_object_store_url

    try:
        node = load_config(config)
        check_object_store_url(node.object_store_url)
    except (ConfigError, ObjectStoreCheckError) as exc:
        typer.echo(f"invalid configuration in {config}: {exc}", err=True)
        raise typer.Exit(2) from None
    return node


@app.command()
def broker(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config file (see docs/configuration.md)"),
) -> None:
    """Run a Kafka-protocol broker."""
    from automq.broker.config import ConfigError, check_broker_config
    from automq.broker.kafka.process import run_broker

    node = _load(config)
    try:
        check_broker_config(node)
    except ConfigError as exc:
        typer.echo(f"invalid configuration in {config}: {exc}", err=True)
        raise typer.Exit(2) from None
    run_broker(node)


@app.command()
def controller(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config file (see docs/configuration.md)"),
) -> None:
    """Run the metadata controller."""
    from automq.broker.controller.process import run_controller

    run_controller(_load(config))


@app.command()
def operator(
    namespace: list[str] | None = typer.Option(
        None, "--namespace", "-n", help="Watch only these namespaces (repeatable)."
    ),
    all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="Watch every namespace."),
    liveness: str | None = typer.Option("http://0.0.0.0:8080/healthz", help="Liveness endpoint URL, or '' to disable."),
    metrics_port: int = typer.Option(
        8081, "--metrics-port", min=0, max=65535, help="Prometheus /metrics port; 0: off."
    ),
    leader_election: bool = typer.Option(
        True,
        "--leader-election/--no-leader-election",
        help="Replicas elect one active operator through the Lease automq-operator in the pod's namespace.",
    ),
) -> None:
    """Run the Kubernetes operator (kube config: in-cluster, then KUBECONFIG)."""
    from automq.operator.main import run_operator

    run_operator(
        namespaces=namespace or [],
        clusterwide=all_namespaces or not namespace,
        liveness=liveness or None,
        metrics_port=metrics_port or None,
        leader_election=leader_election,
    )


@app.command()
def rebalance(
    bootstrap: str = typer.Option(..., "--bootstrap", "-b", help="Kafka bootstrap HOST:PORT of the cluster."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the proposal, move nothing."),
    tolerance: float = typer.Option(
        10.0, "--tolerance", help="Per-broker bytes in/out may differ this many percent from the mean."
    ),
    max_moves: int = typer.Option(10, "--max-moves", min=0, help="At most this many moves (not for --drain)."),
    drain: int | None = typer.Option(None, "--drain", help="Move every partition off this broker id instead."),
    exclude: list[int] | None = typer.Option(None, "--exclude", help="Broker id to empty and never fill (repeatable)."),
    output: str = typer.Option("table", "--output", "-o", help="table or json."),
    interval: float = typer.Option(5.0, "--interval", min=0.5, help="Seconds between the two metric scrapes."),
    metrics_url: list[str] | None = typer.Option(
        None, "--metrics-url", help="BROKER_ID=URL of a broker's /metrics (default: what brokers report)."
    ),
    max_concurrent: int = typer.Option(4, "--max-concurrent", min=1, help="Moves running at once."),
    move_timeout: float = typer.Option(60.0, "--move-timeout", min=1.0, help="Seconds one move may take."),
    controller: list[str] | None = typer.Option(
        None, "--controller", help="Controller URL: use its view (draining/fenced brokers). Repeatable."
    ),
    command_config: Path | None = typer.Option(
        None, "--command-config", help="Kafka client properties for TLS / SASL (as Kafka's tools take them)."
    ),
) -> None:
    """Balance partitions by measured load (exit 0 ok, 1 a move failed, 2 no decision)."""
    from automq.broker.admin.cli import client_security
    from automq.broker.balancer.cli import RebalanceOptions, parse_metrics_urls, run_rebalance
    from automq.broker.config import ConfigError

    if output not in ("table", "json"):
        typer.echo(f"--output must be table or json, got {output!r}", err=True)
        raise typer.Exit(2)
    try:
        urls = parse_metrics_urls(metrics_url or [])
        security = client_security(command_config)
    except (ValueError, ConfigError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    options = RebalanceOptions(
        bootstrap=bootstrap,
        security=security,
        dry_run=dry_run,
        tolerance=tolerance,
        max_moves=max_moves,
        drain=drain,
        exclude=tuple(exclude or ()),
        output=output,
        interval_s=interval,
        metrics_urls=urls,
        max_concurrent=max_concurrent,
        move_timeout_s=move_timeout,
        controller_urls=tuple(controller or ()),
    )
    sys.exit(run_rebalance(options))


def _local_controller_url(data_dir: Path) -> str | None:
    """The controller URL of a cluster `automq local up` made in `data_dir`, if there is one."""
    path = data_dir / "config" / "controller.yaml"
    if not path.is_file():
        return None
    from automq.broker.config import ConfigError, load_config

    try:
        config = load_config(path)
    except ConfigError:
        return None
    if config.security.controller_tls:  # `local up --secure`: the API is https and wants its token
        import os

        from automq.broker.security.controller_auth import CA_FILE_ENV, TOKEN_FILE_ENV

        if config.security.controller_token_file:
            os.environ.setdefault(TOKEN_FILE_ENV, config.security.controller_token_file)
        if config.tls.ca_file:
            os.environ.setdefault(CA_FILE_ENV, config.tls.ca_file)
        return f"https://127.0.0.1:{config.http_port}"
    return f"http://127.0.0.1:{config.http_port}"


@app.command()
def status(
    controller: list[str] | None = typer.Option(
        None, "--controller", help="Controller URL (repeatable). Default: the local cluster in --data-dir."
    ),
    data_dir: Path = typer.Option(Path(".automq-local"), "--data-dir", help="A local cluster's data dir."),
    output: str = typer.Option("table", "--output", "-o", help="table or json."),
    timeout: float = typer.Option(5.0, "--timeout", min=0.5, help="Seconds to wait for each answer."),
) -> None:
    """How the cluster is: controllers (which leads, ready or why not), brokers (state, epoch,
    heartbeat, partitions, WAL backlog), partitions and problems. Exit 0 healthy, 1 problems, 2 usage."""
    import asyncio
    import json

    from rich.console import Console

    from automq.broker.admin.status import collect_status, render

    if output not in ("table", "json"):
        typer.echo(f"--output must be table or json, got {output!r}", err=True)
        raise typer.Exit(2)
    urls = [u.rstrip("/") for u in controller or []]
    if not urls:
        local = _local_controller_url(data_dir)
        if local is None:
            typer.echo(
                f"no --controller given and no local cluster in {data_dir} (start one with `automq local up`)",
                err=True,
            )
            raise typer.Exit(2)
        urls = [local]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            typer.echo(f"--controller {url!r} is not an http(s):// URL", err=True)
            raise typer.Exit(2)
    result = asyncio.run(collect_status(urls, timeout_s=timeout))
    if output == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render(result, Console())
    raise typer.Exit(0 if result.healthy else 1)


@local_app.command("up")
def local_up(
    brokers: int | None = typer.Option(
        None, "--brokers", min=1, max=16, help="Number of brokers (default: as last time in this data dir, else 1)."
    ),
    data_dir: Path = typer.Option(
        Path(".automq-local"), "--data-dir", help="Where WALs, logs and the embedded object store live."
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        min=1,
        max=65535,
        help="First broker's Kafka port; the others follow (default: as last time, else 9092).",
    ),
    object_store: str | None = typer.Option(
        None, "--object-store", help="s3://bucket?endpoint=... (default: file:// under --data-dir)."
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        "-d",
        help="Run in the background; print the bootstrap once it serves; `local down` stops it.",
    ),
    sets: list[str] = typer.Option(
        [],
        "--set",
        help="KEY=VALUE for every node's config (repeatable): dotted keys such as kafka.num_partitions=3, "
        "or Kafka names such as group.initial.rebalance.delay.ms=0. Unknown keys fail the start.",
    ),
    config_file: Path | None = typer.Option(
        None, "--config", help="A YAML fragment of a node config merged into every node's config (--set wins)."
    ),
    secure: bool = typer.Option(
        False,
        "--secure",
        help="TLS + SCRAM-SHA-512: SASL_SSL listeners, an https controller API with a token, a user `admin`; "
        "certificates and secrets under <data-dir>/secure; prints the client settings.",
    ),
) -> None:
    """Start a controller and N brokers as processes on 127.0.0.1; Ctrl-C stops them."""
    from automq.broker import local

    if detach:
        argv = ["--data-dir", str(data_dir)]
        argv += ["--brokers", str(brokers)] if brokers is not None else []
        argv += ["--port", str(port)] if port is not None else []
        argv += ["--object-store", object_store] if object_store is not None else []
        for item in sets:
            argv += ["--set", item]
        argv += ["--config", str(config_file.expanduser().resolve())] if config_file is not None else []
        argv += ["--secure"] if secure else []
        sys.exit(local.detach(argv, data_dir))
    sys.exit(
        local.run_local_cluster(
            brokers=brokers,
            data_dir=data_dir,
            port=port,
            object_store_url=object_store,
            sets=sets,
            config_file=config_file,
            secure=secure,
        )
    )


@local_app.command("down")
def local_down(
    data_dir: Path = typer.Option(Path(".automq-local"), "--data-dir", help="The data dir of the cluster to stop."),
) -> None:
    """Stop a cluster started with `local up --detach` (brokers first, then the controller)."""
    from automq.broker.local import local_down as stop

    sys.exit(stop(data_dir))


@wal_app.command("recover")
def wal_recover(
    wal: Path = typer.Option(..., "--wal", help="The lost broker's WAL file or block device."),
    controller: list[str] = typer.Option(..., "--controller", help="Controller URL (repeatable)."),
    node_id: int = typer.Option(..., "--node-id", min=0, help="The lost broker's node id."),
    object_store: str = typer.Option(
        ..., "--object-store", help="The cluster's object store URL (s3://bucket?endpoint=... or file://)."
    ),
    fenced_epoch: int | None = typer.Option(
        None, "--fenced-epoch", help="Node epoch the operator fenced; a broker back under a newer one is left alone."
    ),
    timeout: float = typer.Option(
        30.0, "--controller-timeout", min=1.0, help="Seconds to keep retrying the controller."
    ),
) -> None:
    """Recover a fenced broker's volume WAL: claim its recovery job at the controller, replay the
    WAL from its trim point, upload and commit, complete the job, exit. Safe to rerun."""
    import asyncio
    import logging

    from automq.broker.controller.client import ControllerClient
    from automq.broker.controller.wal_recover import WalRecoverError, recover_lost_wal
    from automq.broker.logs import configure_logging
    from automq.broker.objectstore import open_object_store
    from automq.broker.storage.metadata import MetadataError

    configure_logging(logging.INFO, process="wal-recover")

    async def run() -> str:
        client = ControllerClient(controller, retry_deadline_s=timeout)
        store = open_object_store(object_store)
        try:
            return (await recover_lost_wal(client, store, node_id, wal, fenced_epoch=fenced_epoch)).summary()
        finally:
            await client.close()
            await store.close()

    try:
        typer.echo(asyncio.run(run()))
    except (WalRecoverError, MetadataError, ValueError, OSError) as exc:
        typer.echo(f"automq wal recover: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None


def _import_kio_without_hypothesis() -> None:
    """kio registers Hypothesis strategies for its types whenever Hypothesis is importable
    (`kio.static._phantom` tries `import hypothesis.strategies` at import time, which pulls in
    unittest and attrs too): about half a second of every process start on this machine, for
    nothing a server uses. A process started through this command imports kio with Hypothesis
    hidden; processes that import kio otherwise (test runs) keep the strategies."""
    if "kio.static._phantom" in sys.modules or "hypothesis" in sys.modules:
        return
    sys.modules["hypothesis"] = None  # type: ignore[assignment]  # `import hypothesis...` raises ImportError
    try:
        import kio.static._phantom  # noqa: F401
    finally:
        del sys.modules["hypothesis"]


def main() -> None:
    _import_kio_without_hypothesis()
    app()


if __name__ == "__main__":
    main()
