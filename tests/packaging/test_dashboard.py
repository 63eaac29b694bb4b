"""The Grafana dashboard, checked as strongly as this machine allows without a Grafana server.

- Grafana's own dashboard model (grafana-foundation-sdk, generated from Grafana's schema) reads
  the dashboard and writes it back unchanged: a key Grafana does not know (a typo such as
  `gridpos` or `legendFormt`) is dropped by the model, so it would show up here as a difference;
  every query decodes as a Prometheus query.
- Every query is parsed by a real PromQL parser (promql-parser: Prometheus's grammar, ported to
  Rust), after Grafana's `$__rate_interval` is replaced by a duration, as Grafana does.
- Every metric a query selects is one the code declares (the generated metrics reference), with
  the suffix its type gives it (`_total`, `_bucket`), and every label a query matches on, groups
  by or shows in a legend is declared on one of the metrics it selects, or is added by the scrape.
- The datasource is a variable, every panel and query uses it, ids are unique and panels do not
  overlap on Grafana's 24-column grid.

Not proven here: how Grafana renders it (no Grafana server can run on these machines), and that
the queries return data; tests/e2e/test_observability.py checks that every queried metric is
exposed by a live broker, controller or the operator.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import promql_parser
import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import prometheus as prometheus_model
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client import CollectorRegistry, ProcessCollector

from automq.operator.observability import DASHBOARD, REFERENCE, build_dashboard, declared_labels, documented_names

# Labels Prometheus adds to every scraped series (kubernetes_sd / PodMonitor relabelling).
TARGET_LABELS = {"instance", "job", "pod", "namespace", "container", "service", "endpoint"}
GRAFANA_RANGE_VARIABLES = ("$__rate_interval", "$__interval", "$__range")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    built = build_dashboard()
    assert json.loads(DASHBOARD.read_text()) == built, "run `python -m automq.operator.observability`"
    return built


def round_trip(dashboard: dict[str, Any]) -> dict[str, Any]:
    register_default_plugins()
    return json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))


def lost_in(original: Any, echoed: Any, path: str = "") -> list[str]:
    """Keys or values of `original` that Grafana's model did not keep."""
    if isinstance(original, dict) and isinstance(echoed, dict):
        out = []
        for key, value in original.items():
            if key not in echoed:
                out.append(f"{path}.{key} dropped")
            else:
                out += lost_in(value, echoed[key], f"{path}.{key}")
        return out
    if isinstance(original, list) and isinstance(echoed, list):
        if len(original) != len(echoed):
            return [f"{path}: {len(original)} items became {len(echoed)}"]
        return [d for i, (a, b) in enumerate(zip(original, echoed, strict=True)) for d in lost_in(a, b, f"{path}[{i}]")]
    return [] if original == echoed else [f"{path}: {original!r} became {echoed!r}"]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_grafanas_dashboard_model_keeps_every_key_and_value(dashboard):
    assert lost_in(dashboard, round_trip(dashboard)) == []
    register_default_plugins()
    model = Dashboard.from_json(dashboard)
    queries = [t for p in model.panels or [] for t in getattr(p, "targets", None) or []]
    assert queries and all(isinstance(q, prometheus_model.Dataquery) for q in queries)


def test_the_model_check_catches_misspelled_keys(dashboard):
    bad = copy.deepcopy(dashboard)
    panel = panels(bad)[0]
    panel["gridpos"] = panel.pop("gridPos")
    panel["targets"][0]["legendFormt"] = panel["targets"][0].pop("legendFormat")
    panel["options"]["legend"]["placment"] = panel["options"]["legend"].pop("placement")
    lost = lost_in(bad, round_trip(bad))
    assert len(lost) == 3 and all(entry.endswith("dropped") for entry in lost), lost


def as_prometheus_query(expr: str) -> str:
    for variable in GRAFANA_RANGE_VARIABLES:
        expr = expr.replace(variable, "5m")
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def walk(node: Any, selectors: list[Any], labels: set[str]) -> None:
    """Collect vector selectors and every label name the expression refers to."""
    if isinstance(node, promql_parser.VectorSelector):
        selectors.append(node)
        labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
    elif isinstance(node, promql_parser.MatrixSelector):
        walk(node.vector_selector, selectors, labels)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.modifier is not None:
            labels.update(node.modifier.labels)
        walk(node.expr, selectors, labels)
        if node.param is not None:
            walk(node.param, selectors, labels)
    elif isinstance(node, promql_parser.BinaryExpr):
        if node.modifier is not None:
            if node.modifier.matching is not None:
                labels.update(node.modifier.matching.labels)
            labels.update(node.modifier.group_labels or [])
        walk(node.lhs, selectors, labels)
        walk(node.rhs, selectors, labels)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            walk(arg, selectors, labels)
    elif isinstance(node, promql_parser.ParenExpr | promql_parser.SubqueryExpr | promql_parser.UnaryExpr):
        walk(node.expr, selectors, labels)


def declared_series() -> dict[str, set[str]]:
    """Every series name the code can expose, with the labels it carries: the metrics objects the
    code declares, the generated reference (which also has the custom collectors' families), and
    prometheus_client's process collector (`process_*`, on every process)."""
    families: dict[str, set[str]] = {name: set(labels) for name, labels in declared_labels().items()}
    histograms: set[str] = set()
    for name, kind, labels in re.findall(
        r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \| (\w+) \| ([^|]*) \|", REFERENCE.read_text(), re.M
    ):
        families.setdefault(name, set()).update(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", labels))
        if kind in ("histogram", "summary"):
            histograms.add(name)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    for family in registry.collect():
        for sample in family.samples:
            families.setdefault(sample.name, set()).update(sample.labels)
    out = dict(families)
    for name in histograms:
        for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
            out[f"{name}{suffix}"] = families[name] | extra
    return out


def test_every_query_parses_and_selects_declared_metrics_and_labels(dashboard):
    series = declared_series()
    documented = documented_names(REFERENCE.read_text())
    problems: list[str] = []
    parsed = 0
    for panel in panels(dashboard):
        for target in panel["targets"]:
            where = f"panel {panel['title']!r} query {target['refId']}"
            try:
                tree = promql_parser.parse(as_prometheus_query(target["expr"]))
            except Exception as exc:  # the parser raises its own error types
                problems.append(f"{where}: does not parse: {exc}")
                continue
            parsed += 1
            selectors: list[Any] = []
            used: set[str] = set()
            walk(tree, selectors, used)
            if not selectors:
                problems.append(f"{where}: selects no metric")
            available = set(TARGET_LABELS)
            for selector in selectors:
                name = selector.name
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                if name not in series:
                    problems.append(f"{where}: {name} is not a metric the code declares")
                elif name not in documented and base not in documented and not name.startswith("process_"):
                    problems.append(f"{where}: {name} is missing from docs/metrics-reference.md")
                available |= series.get(name, set())
            for label in sorted(used - available):
                problems.append(f"{where}: label {label!r} is on none of {[s.name for s in selectors]}")
            for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", target.get("legendFormat", "")):
                if label not in available:
                    problems.append(f"{where}: the legend shows {label!r}, which no selected metric has")
    assert parsed and not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(kafka_server_brokertopicmetrics_bytesin_total[5m])",  # unbalanced
        "sum by (topic) rate(x[5m])",  # aggregation without parentheses around its argument
        "rate(x[5 m])",
    ],
)
def test_the_parser_refuses_broken_promql(expr):
    with pytest.raises(Exception):  # noqa: B017 - any parse error will do, its type is the parser's own
        promql_parser.parse(expr)


def test_the_datasource_is_a_variable_every_panel_uses(dashboard):
    [variable] = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    reference = "${" + variable["name"] + "}"
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": reference}, panel["title"]
        assert all(t["datasource"] == {"type": "prometheus", "uid": reference} for t in panel["targets"])
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_ids_are_unique_and_panels_tile_the_grid_without_overlap(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
