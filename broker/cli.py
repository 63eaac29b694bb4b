"""The `automq` command: one entry point for every process the image runs.

    automq local up       a whole cluster on this machine (controller + brokers), embedded object store
    automq broker         a Kafka-protocol broker
    automq controller     the metadata controller
    automq operator       the Kubernetes operator

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
app.add_typer(local_app, name="local")


def _load(config: Path):
    from automq.broker.config import ConfigError, load_config

    try:
        return load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


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
) -> None:
    """Run the Kubernetes operator (kube config: in-cluster, then KUBECONFIG)."""
    from automq.operator.main import run_operator

    run_operator(namespaces=namespace or [], clusterwide=all_namespaces or not namespace, liveness=liveness or None)


@local_app.command("up")
def local_up(
    brokers: int = typer.Option(1, "--brokers", min=1, max=16, help="Number of brokers."),
    data_dir: Path = typer.Option(
        Path(".automq-local"), "--data-dir", help="Where WALs, logs and the embedded object store live."
    ),
    port: int = typer.Option(9092, "--port", min=1, max=65535, help="First broker's Kafka port; the others follow."),
    object_store: str | None = typer.Option(
        None, "--object-store", help="s3://bucket?endpoint=... (default: file:// under --data-dir)."
    ),
) -> None:
    """Start a controller and N brokers as processes on 127.0.0.1; Ctrl-C stops them."""
    from automq.broker.local import run_local_cluster

    sys.exit(run_local_cluster(brokers=brokers, data_dir=data_dir, port=port, object_store_url=object_store))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
