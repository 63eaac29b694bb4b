"""What the cluster exposes for monitoring, as data: the reference list of metrics (read from
running processes' /metrics, so it is generated from the code, never hand-kept) and the Grafana
dashboard shipped with the chart (built here from panel definitions, so every query names a
metric the reference lists; a test checks both against a live cluster).

    python -m automq.operator.observability            # rewrite docs/metrics-reference.md and the dashboard
    python -m automq.operator.observability --check    # exit 1 if either is stale

Regenerating starts a throw-away local cluster (`automq local up --detach` in a temp dir).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "metrics-reference.md"
DASHBOARD = ROOT / "charts" / "automq-operator" / "files" / "grafana-dashboard.json"


@dataclass(frozen=True)
class Family:
    name: str  # as exposed: counters end in _total
    type: str
    help: str
    labels: tuple[str, ...]


_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")
_HELP = re.compile(r"^# HELP (\S+) (.*)$")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def parse_families(text: str) -> dict[str, Family]:
    """Metric families of a Prometheus text exposition (prometheus_client's `_created`
    timestamps left out: they are bookkeeping, not metrics to chart)."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if m := _HELP.match(line):
            helps[m.group(1)] = m.group(2)
        elif m := _TYPE.match(line):
            types[m.group(1)] = m.group(2)
        elif line and line[0] != "#" and (m := _SAMPLE.match(line)):
            name = m.group(1)
            for base in (name, re.sub(r"_(bucket|sum|count|total)$", "", name)):
                labels.setdefault(base, set()).update(_LABEL.findall(m.group(2) or ""))
    out = {}
    for name, kind in types.items():
        if name.endswith("_created"):
            continue
        base = re.sub(r"_total$", "", name)
        seen = labels.get(name, set()) | labels.get(base, set())
        exposed = name if kind != "counter" or name.endswith("_total") else f"{name}_total"
        out[exposed] = Family(exposed, kind, helps.get(name, ""), tuple(sorted(seen - {"le", "quantile"})))
    return out


def declared_labels() -> dict[str, tuple[str, ...]]:
    """Label names as the code declares them (a labelled metric with no series yet shows none)."""
    from prometheus_client import CollectorRegistry

    from automq.broker.controller.controller import ControllerMetrics
    from automq.broker.kafka.metrics import KafkaMetrics
    from automq.broker.storage.metrics import StorageMetrics
    from automq.operator import metrics as operator_metrics
    from automq.operator import nodeloss

    registry = CollectorRegistry()
    KafkaMetrics(registry)
    StorageMetrics(registry)
    ControllerMetrics(registry)
    collectors = [*registry._collector_to_names, *vars(operator_metrics).values(), *vars(nodeloss).values()]
    out: dict[str, tuple[str, ...]] = {}
    for c in collectors:
        if hasattr(c, "_labelnames") and hasattr(c, "_name"):
            kind = getattr(c, "_type", "")
            name = f"{c._name}_total" if kind == "counter" else c._name
            out[name] = tuple(sorted(c._labelnames))
    return out


def with_declared_labels(families: dict[str, Family]) -> dict[str, Family]:
    declared = declared_labels()
    return {
        n: Family(f.name, f.type, f.help, tuple(sorted(set(f.labels) | set(declared.get(n, ())))))
        for n, f in families.items()
    }


def operator_families() -> dict[str, Family]:
    """The operator's metrics, from its modules' collectors (the operator needs a cluster to run)."""
    from prometheus_client import REGISTRY, generate_latest

    import automq.operator.metrics
    import automq.operator.nodeloss  # noqa: F401

    text = generate_latest(REGISTRY).decode()
    families = parse_families(text)
    from automq.operator import metrics as m
    from automq.operator import nodeloss

    label_sets = {
        metric._name: tuple(metric._labelnames)
        for module in (m, nodeloss)
        for metric in vars(module).values()
        if hasattr(metric, "_labelnames")
    }
    out = {}
    for name, family in families.items():
        if not name.startswith("automq_operator_"):
            continue
        base = re.sub(r"_total$", "", name)
        out[name] = Family(name, family.type, family.help, tuple(sorted(label_sets.get(base, family.labels))))
    return out


# ---------------------------------------------------------------------------- the reference

SECTIONS = (
    ("Broker", "every broker's `GET :<http_port>/metrics` (9094 on Kubernetes)"),
    ("Controller", "every controller's `GET :<http_port>/metrics` (9093 on Kubernetes)"),
    ("Operator", "the operator's `GET :8081/metrics` (`--metrics-port`)"),
)


def render_reference(sections: dict[str, dict[str, Family]]) -> str:
    lines = [
        "# Metrics reference",
        "",
        "Generated by `python -m automq.operator.observability` from running processes; do not edit.",
        "What the main ones mean for operations, and which names Kafka dashboards share, is in",
        "[metrics.md](metrics.md). Python's own `process_*` and `python_*` metrics are on every",
        "process and left out here.",
        "",
    ]
    for title, where in SECTIONS:
        families = sections.get(title, {})
        lines += [
            f"## {title}",
            "",
            f"Served on {where}.",
            "",
            "| metric | type | labels | meaning |",
            "|---|---|---|---|",
        ]
        for name in sorted(families):
            if name.startswith(("process_", "python_")):
                continue
            f = families[name]
            help_text = f.help.replace("|", "\\|")
            lines.append(f"| `{name}` | {f.type} | {', '.join(f'`{x}`' for x in f.labels) or '-'} | {help_text} |")
        lines.append("")
    return "\n".join(lines)


def documented_names(reference: str) -> set[str]:
    return set(re.findall(r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \|", reference, re.M))


# ---------------------------------------------------------------------------- the dashboard

RATE = "[$__rate_interval]"


def _target(expr: str, legend: str) -> dict[str, Any]:
    return {
        "expr": expr,
        "legendFormat": legend,
        "refId": "A",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
    }


def _panel(
    title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int, w: int = 12, h: int = 8
) -> dict[str, Any]:
    targets = []
    for i, (expr, legend) in enumerate(exprs):
        t = _target(expr, legend)
        t["refId"] = chr(ord("A") + i)
        targets.append(t)
    return {
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi"},
        },
        "targets": targets,
    }


def _row(title: str, y: int) -> dict[str, Any]:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def _p99(metric: str, by: str) -> str:
    return f"histogram_quantile(0.99, sum by (le, {by}) (rate({metric}_bucket{RATE})))"


DASHBOARD_ROWS: list[tuple[str, list[tuple[str, list[tuple[str, str]], str]]]] = [
    (
        "Cluster",
        [
            (
                "Bytes in / out",
                [
                    ("sum(rate(kafka_server_brokertopicmetrics_bytesin_total" + RATE + "))", "in"),
                    ("sum(rate(kafka_server_brokertopicmetrics_bytesout_total" + RATE + "))", "out"),
                ],
                "Bps",
            ),
            (
                "Messages in",
                [("sum(rate(kafka_server_brokertopicmetrics_messagesin_total" + RATE + "))", "messages/s")],
                "short",
            ),
            (
                "Bytes in per topic",
                [("sum by (topic) (rate(kafka_topic_bytes_in_total" + RATE + "))", "{{topic}}")],
                "Bps",
            ),
            (
                "Partitions led and connections",
                [
                    ("sum(kafka_partitions_led)", "partitions"),
                    ("sum(kafka_connections)", "connections"),
                ],
                "short",
            ),
        ],
    ),
    (
        "Brokers",
        [
            (
                "Bytes in per broker",
                [
                    (
                        "sum by (instance) (rate(kafka_server_brokertopicmetrics_bytesin_total" + RATE + "))",
                        "{{instance}}",
                    )
                ],
                "Bps",
            ),
            ("Request p99 by API", [(_p99("kafka_request_latency_seconds", "api"), "{{api}}")], "s"),
            ("Requests by API", [("sum by (api) (rate(kafka_requests_total" + RATE + "))", "{{api}}")], "reqps"),
            (
                "Request errors by API",
                [("sum by (api) (rate(kafka_request_errors_total" + RATE + "))", "{{api}}")],
                "reqps",
            ),
            ("CPU per broker", [("rate(process_cpu_seconds_total" + RATE + ")", "{{instance}}")], "percentunit"),
            (
                "Consumer groups",
                [
                    ("sum by (type) (kafka_coordinator_groups)", "{{type}} groups"),
                    ("sum by (type) (kafka_coordinator_members)", "{{type}} members"),
                ],
                "short",
            ),
            (
                "KIP-848 rebalances and fencings",
                [
                    ("sum(rate(kafka_coordinator_consumer_group_rebalances_total" + RATE + "))", "rebalances/s"),
                    (
                        "sum by (reason) (rate(kafka_coordinator_consumer_member_fencings_total" + RATE + "))",
                        "fenced ({{reason}})/s",
                    ),
                    ("sum(kafka_coordinator_consumer_members_reconciling)", "members reconciling"),
                ],
                "short",
            ),
            (
                "Share groups (KIP-932): rebalances and fencings",
                [
                    ("sum(rate(kafka_coordinator_share_group_rebalances_total" + RATE + "))", "rebalances/s"),
                    (
                        "sum by (reason) (rate(kafka_coordinator_share_member_fencings_total" + RATE + "))",
                        "fenced ({{reason}})/s",
                    ),
                ],
                "short",
            ),
        ],
    ),
    (
        "Storage: WAL, uploads, object store",
        [
            ("WAL backlog (not uploaded)", [("automq_storage_wal_bytes_pending", "{{instance}}")], "bytes"),
            ("WAL sync p99", [(_p99("automq_storage_wal_sync_seconds", "instance"), "{{instance}}")], "s"),
            ("Append p99", [(_p99("automq_storage_append_seconds", "instance"), "{{instance}}")], "s"),
            (
                "Uploads",
                [
                    ("sum(rate(automq_storage_upload_bytes_total" + RATE + "))", "bytes/s"),
                    ("sum(rate(automq_storage_upload_failures_total" + RATE + "))", "failures/s"),
                ],
                "short",
            ),
            ("Object GET p99", [(_p99("automq_storage_object_read_seconds", "instance"), "{{instance}}")], "s"),
            ("WAL full waits", [("sum(rate(automq_storage_wal_full_total" + RATE + "))", "waits/s")], "short"),
        ],
    ),
    (
        "Controller",
        [
            (
                "Leader and metadata version",
                [
                    ("max(automq_controller_leader)", "has a leader"),
                    ("max(automq_controller_metadata_version)", "metadata version"),
                ],
                "short",
            ),
            (
                "Metadata log append p99",
                [(_p99("automq_controller_log_append_seconds", "instance"), "{{instance}}")],
                "s",
            ),
            (
                "Object store errors and stalls",
                [
                    ("sum(rate(automq_controller_object_store_errors_total" + RATE + "))", "errors/s"),
                    ("max(automq_controller_object_store_stalled)", "stalled"),
                ],
                "short",
            ),
            (
                "Brokers fenced",
                [("sum(increase(automq_controller_brokers_fenced_total" + RATE + "))", "fenced")],
                "short",
            ),
        ],
    ),
    (
        "Operator: balancer and autoscaler",
        [
            (
                "Imbalance by goal",
                [("max by (cluster, goal) (automq_operator_imbalance)", "{{cluster}} {{goal}}")],
                "short",
            ),
            (
                "Partition moves",
                [
                    (
                        "sum by (cluster, result) (increase(automq_operator_partition_moves_total" + RATE + "))",
                        "{{cluster}} {{result}}",
                    ),
                    ("sum by (cluster) (automq_operator_partition_moves_in_flight)", "{{cluster}} in flight"),
                ],
                "short",
            ),
            ("Desired brokers", [("max by (cluster) (automq_operator_desired_brokers)", "{{cluster}}")], "short"),
            (
                "Node-loss recoveries",
                [
                    (
                        "sum by (strategy) (increase(automq_operator_node_loss_recoveries_total" + RATE + "))",
                        "{{strategy}}",
                    )
                ],
                "short",
            ),
        ],
    ),
]


def build_dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for title, row_panels in DASHBOARD_ROWS:
        row = _row(title, y)
        row["id"] = pid
        pid += 1
        panels.append(row)
        y += 1
        for i, (panel_title, exprs, unit) in enumerate(row_panels):
            panel = _panel(panel_title, exprs, unit, x=(i % 2) * 12, y=y + (i // 2) * 8)
            panel["id"] = pid
            pid += 1
            panels.append(panel)
        y += ((len(row_panels) + 1) // 2) * 8
    return {
        "title": "AutoMQ (automq-py) cluster",
        "uid": "automq-py-cluster",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "tags": ["automq", "kafka"],
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_metrics(dashboard: dict[str, Any]) -> set[str]:
    """Metric names the dashboard's queries use."""
    names = set()
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", t["expr"]):
                if token.startswith(("kafka_", "automq_", "process_")):
                    names.add(re.sub(r"_bucket$", "", token))
    return names


# ---------------------------------------------------------------------------- generation


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def live_sections(broker_metrics_url: str, controller_metrics_url: str) -> dict[str, dict[str, Family]]:
    return {
        "Broker": with_declared_labels(parse_families(_scrape(broker_metrics_url))),
        "Controller": with_declared_labels(parse_families(_scrape(controller_metrics_url))),
        "Operator": operator_families(),
    }


def _local_cluster_sections() -> dict[str, dict[str, Family]]:
    import yaml

    from automq.broker import local

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        up = subprocess.run(
            [
                sys.executable,
                "-m",
                "automq.broker.cli",
                "local",
                "up",
                "--detach",
                "--data-dir",
                str(data_dir),
                "--port",
                str(local.free_port_block(1)),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        if up.returncode != 0:
            raise SystemExit(f"could not start a local cluster: {up.stderr}")
        try:
            ports = {
                n: yaml.safe_load((data_dir / "config" / f"{n}.yaml").read_text())["http_port"]
                for n in ("broker-1", "controller")
            }
            return live_sections(
                f"http://127.0.0.1:{ports['broker-1']}/metrics", f"http://127.0.0.1:{ports['controller']}/metrics"
            )
        finally:
            local.local_down(data_dir)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    dashboard = json.dumps(build_dashboard(), indent=2, sort_keys=True) + "\n"
    reference = render_reference(_local_cluster_sections())
    stale = []
    for path, text in ((REFERENCE, reference), (DASHBOARD, dashboard)):
        if path.exists() and path.read_text() == text:
            continue
        if check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("stale: " + ", ".join(stale) + "; run python -m automq.operator.observability", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
