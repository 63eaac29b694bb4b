"""`automq operator`: run the kopf operator for AutoMQCluster resources.

Kube config resolution is kopf's and the `kubernetes` package's: the in-cluster service
account when running in a pod, else KUBECONFIG / ~/.kube/config.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import prometheus_client

from automq.broker.logs import configure_logging
from automq.operator.controller_api import ControllerApiFactory, connect
from automq.operator.handlers import OperatorContext, register
from automq.operator.reconcile import ReconcileSettings


async def operate(
    namespaces: list[str],
    clusterwide: bool,
    liveness: str | None = None,
    *,
    context: OperatorContext | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    """The operator as a coroutine (tests run it in a thread with their own flags)."""
    if not clusterwide and not namespaces:
        raise ValueError("give namespaces to watch, or clusterwide=True")
    context = context or OperatorContext()
    registry = register(kopf.OperatorRegistry())
    await kopf.operator(
        registry=registry,
        clusterwide=clusterwide,
        namespaces=[] if clusterwide else namespaces,
        liveness_endpoint=liveness,
        standalone=True,
        memo=kopf.Memo(automq=context),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_operator(
    namespaces: list[str],
    clusterwide: bool,
    liveness: str | None,
    *,
    controller_api_factory: ControllerApiFactory = connect,
    settings: ReconcileSettings | None = None,
    metrics_port: int | None = None,
    leader_election: bool = True,
) -> None:
    """Block running the operator until SIGINT/SIGTERM (called by `automq operator`).

    `metrics_port` serves the operator's Prometheus metrics at http://0.0.0.0:<port>/metrics.
    `leader_election`: replicas elect one active operator through the Lease `automq-operator`
    in the pod's namespace (automq.operator.leadership); off, this process acts alone."""
    configure_logging(logging.INFO, process="operator")
    if metrics_port:
        # The operator's own metrics: node-loss recoveries, partition moves, imbalance, scale decisions.
        prometheus_client.start_http_server(metrics_port)
    context = OperatorContext(
        controller_api_factory=controller_api_factory,
        settings=settings or ReconcileSettings(),
        leader_election={} if leader_election else None,
    )
    asyncio.run(operate(namespaces, clusterwide, liveness, context=context))
