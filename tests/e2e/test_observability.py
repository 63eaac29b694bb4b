"""The metrics reference and the Grafana dashboard against a live cluster: every metric a broker
or controller exposes is in docs/metrics-reference.md, and every metric the dashboard queries
exists on a live process (or the operator)."""

from __future__ import annotations

import json

from automq.operator.observability import (
    DASHBOARD,
    REFERENCE,
    build_dashboard,
    dashboard_metrics,
    documented_names,
    live_sections,
)


def test_reference_and_dashboard_match_what_live_processes_expose(cluster):
    broker = f"http://127.0.0.1:{cluster.http_port('broker-1')}/metrics"
    controller = f"http://127.0.0.1:{cluster.http_port('controller')}/metrics"
    sections = live_sections(broker, controller)
    live = {name for families in sections.values() for name in families}
    documented = documented_names(REFERENCE.read_text())
    undocumented = sorted(n for n in live - documented if not n.startswith(("process_", "python_")))
    assert not undocumented, f"{undocumented}: run `python -m automq.operator.observability`"
    vanished = sorted(documented - live)
    assert not vanished, f"{vanished} are documented but no process exposes them"
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard == build_dashboard(), "run `python -m automq.operator.observability`"
    queried = dashboard_metrics(dashboard)
    assert queried and not sorted(queried - live), (
        f"the dashboard queries metrics nobody exposes: {sorted(queried - live)}"
    )
