"""`automq rebalance`: measure load, print a proposal, and (without --dry-run) execute it.

Works against any cluster of these brokers given one bootstrap address: Kafka Metadata
names brokers, racks and leaders; each broker's `automq.metrics.url` (DescribeConfigs) says
where to scrape; two scrapes `--interval` seconds apart give the rates. With `--controller`
the controller's view is used instead (it knows draining and fenced brokers).

Exit codes: 0 done (or nothing to do), 1 some moves failed, 2 no decision (load data
incomplete, cluster unreachable, bad arguments).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from automq.broker.balancer.executor import MoveExecutor, MoveResult
from automq.broker.balancer.kafka_admin import KafkaAdmin, KafkaAdminError
from automq.broker.balancer.model import FENCED, ClusterMetadata, Incomplete
from automq.broker.balancer.planner import Goals, GoalsError, Proposal, drain, plan
from automq.broker.balancer.scrape import measure
from automq.broker.controller.client import ControllerClient
from automq.broker.security.client import PLAINTEXT, ClientSecurity
from automq.broker.storage.metadata import MetadataError

EXIT_OK, EXIT_MOVES_FAILED, EXIT_NO_DECISION = 0, 1, 2


@dataclass
class RebalanceOptions:
    bootstrap: str
    dry_run: bool = False
    tolerance: float = 10.0
    max_moves: int = 10
    drain: int | None = None
    exclude: Sequence[int] = ()
    output: str = "table"  # table | json
    interval_s: float = 5.0
    metrics_urls: dict[int, str] = field(default_factory=dict)
    max_concurrent: int = 4
    move_timeout_s: float = 60.0
    controller_urls: Sequence[str] = ()  # the controller's view: draining/fenced brokers, registered metrics URLs
    security: ClientSecurity = PLAINTEXT  # TLS / SASL of the Kafka connections (--command-config)


def parse_metrics_urls(items: Sequence[str]) -> dict[int, str]:
    out = {}
    for item in items:
        bid, sep, url = item.partition("=")
        if not sep or not bid.strip().isdigit() or not url.startswith(("http://", "https://")):
            raise ValueError(f"--metrics-url {item!r}: expected BROKER_ID=http://host:port/metrics")
        out[int(bid)] = url
    return out


class _Report:
    def __init__(self, output: str) -> None:
        self.json = output == "json"
        self.console = Console(highlight=False)
        if not self.console.is_terminal:
            self.console = Console(highlight=False, width=160)  # piped: no 80-column wrapping of tables
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self.data: dict[str, Any] = {}

    def fail(self, status: str, message: str, **extra: Any) -> int:
        self.data.update(status=status, message=message, **extra)
        if self.json:
            print(json.dumps(self.data, indent=2))
        else:
            self.err.print(f"[red]{message}[/]")
        return EXIT_NO_DECISION


def _rate(x: float) -> str:
    for unit, size in (("MiB/s", 1 << 20), ("KiB/s", 1 << 10)):
        if abs(x) >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B/s"


def _print_proposal(console: Console, proposal: Proposal, cpu: dict[int, float | None]) -> None:
    moves = Table(title=f"Proposal: {len(proposal.moves)} move(s)")
    for col in ("topic", "partition", "from", "to", "goal", "bytes in", "bytes out"):
        moves.add_column(col)
    for m in proposal.moves:
        moves.add_row(
            m.topic, str(m.partition), str(m.source), str(m.target), m.goal, _rate(m.bytes_in), _rate(m.bytes_out)
        )
    console.print(moves)
    brokers = Table(title="Per-broker load (before → after)")
    for col in ("broker", "rack", "state", "bytes in", "bytes out", "partitions", "cpu cores"):
        brokers.add_column(col)
    for bid, before in sorted(proposal.before.items()):
        after = proposal.after[bid]
        c = cpu.get(bid)
        brokers.add_row(
            str(bid),
            before.rack or "-",
            before.state,
            f"{_rate(before.bytes_in)} → {_rate(after.bytes_in)}",
            f"{_rate(before.bytes_out)} → {_rate(after.bytes_out)}",
            f"{before.partitions} → {after.partitions}",
            "-" if c is None else f"{c:.2f}",
        )
    console.print(brokers)
    imb = ", ".join(
        f"{k} {proposal.imbalance_before[k]:g} → {proposal.imbalance_after[k]:g}" for k in proposal.imbalance_before
    )
    console.print(f"imbalance: {imb}")
    for note in proposal.notes:
        console.print(f"note: {note}")


def _print_results(console: Console, results: list[MoveResult]) -> None:
    table = Table(title="Executed")
    for col in ("partition", "from", "to", "result", "seconds", "attempts"):
        table.add_column(col)
    for r in results:
        table.add_row(
            f"{r.move.topic}-{r.move.partition}",
            str(r.move.source),
            str(r.move.target),
            "ok" if r.ok else f"FAILED: {r.error}",
            f"{r.seconds:.2f}",
            str(r.attempts),
        )
    console.print(table)


async def _controller_view(admin: KafkaAdmin, options: RebalanceOptions) -> ClusterMetadata:
    """Brokers' states (draining, fenced), racks, leaders, moves and registered metrics URLs
    from the controller; a broker that registered no metrics endpoint is asked over Kafka."""
    async with ControllerClient(list(options.controller_urls), retry_deadline_s=10.0) as controller:
        image = await controller.watch_metadata(-1, 0)
    cluster = ClusterMetadata.from_image(image, options.metrics_urls)
    missing = [b for b, meta in cluster.brokers.items() if meta.metrics_url is None and meta.state != FENCED]
    if not missing:
        return cluster
    found = await admin.metrics_urls(missing)
    brokers = {
        b: replace(meta, metrics_url=found[b]) if b in found and not found[b].startswith("error: ") else meta
        for b, meta in cluster.brokers.items()
    }
    return ClusterMetadata(brokers, cluster.leaders, cluster.moving)


async def rebalance(options: RebalanceOptions) -> int:
    report = _Report(options.output)
    try:
        goals = Goals(tolerance_percent=options.tolerance, max_moves=options.max_moves)
    except GoalsError as exc:
        return report.fail("invalid", f"--tolerance/--max-moves: {exc}")
    try:
        admin = KafkaAdmin(options.bootstrap, timeout_s=min(30.0, options.move_timeout_s), security=options.security)
    except ValueError as exc:
        return report.fail("invalid", f"--bootstrap: {exc}")
    async with admin:
        try:
            if options.controller_urls:
                cluster = await _controller_view(admin, options)
            else:
                cluster = await admin.cluster_metadata(options.metrics_urls)
        except KafkaAdminError as exc:
            return report.fail("unreachable", f"cannot read cluster metadata from {options.bootstrap}: {exc}")
        except MetadataError as exc:
            return report.fail("unreachable", f"cannot read metadata from the controller: {exc}")
        if options.drain is not None and options.drain not in cluster.brokers:
            return report.fail(
                "invalid", f"--drain {options.drain}: no such broker (brokers: {sorted(cluster.brokers)})"
            )
        if not report.json:
            report.err.print(
                f"measuring load of {len(cluster.brokers)} broker(s), {len(cluster.leaders)} partition(s) "
                f"over {options.interval_s:g}s ..."
            )
        model = await measure(cluster, interval_s=options.interval_s)
        if isinstance(model, Incomplete):
            return report.fail(
                "incomplete",
                f"no proposal: {model}",
                problems=[{"broker": p.broker_id, "reason": p.reason} for p in model.problems],
            )
        if options.drain is not None:
            proposal = drain(model, [options.drain], goals, exclude=options.exclude)
        else:
            proposal = plan(model, goals, exclude=options.exclude)
        report.data.update(status="proposal", dry_run=options.dry_run, proposal=proposal.to_dict())
        report.data["cpu"] = {str(b): bl.cpu for b, bl in sorted(model.brokers.items())}
        if not report.json:
            _print_proposal(report.console, proposal, {b: bl.cpu for b, bl in model.brokers.items()})
        if options.dry_run or not proposal.moves:
            if report.json:
                print(json.dumps(report.data, indent=2))
            elif not proposal.moves:
                report.console.print("nothing to move")
            return EXIT_OK
        executor = MoveExecutor(admin, max_concurrent=options.max_concurrent, move_timeout_s=options.move_timeout_s)
        results = await executor.execute(proposal.moves)
        report.data.update(status="executed", results=[r.to_dict() for r in results])
        if report.json:
            print(json.dumps(report.data, indent=2))
        else:
            _print_results(report.console, results)
        return EXIT_OK if all(r.ok for r in results) else EXIT_MOVES_FAILED


def run_rebalance(options: RebalanceOptions) -> int:
    try:
        return asyncio.run(rebalance(options))
    except KeyboardInterrupt:
        print("interrupted; moves already started complete on their own", file=sys.stderr)
        return 130
