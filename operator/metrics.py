"""The operator's own Prometheus metrics (served by `automq operator --metrics ...`).

One set per process in prometheus_client's default registry, labelled by cluster, so a
dashboard shows what the balancer and the autoscaler did next to the brokers' metrics.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LABELS = ("namespace", "cluster")

PARTITION_MOVES = Counter(
    "automq_operator_partition_moves",
    "Partition moves the balancer finished (result=ok) or gave up on for now (result=failed)",
    [*LABELS, "result"],
)
MOVES_IN_FLIGHT = Gauge("automq_operator_partition_moves_in_flight", "Partition moves started, not finished", LABELS)
IMBALANCE = Gauge(
    "automq_operator_imbalance",
    "Imbalance per goal at the last evaluation: bytes_in_percent/bytes_out_percent (largest deviation of a "
    "broker from the mean), partition_spread (partitions), evacuate (partitions on leaving brokers), racks",
    [*LABELS, "goal"],
)
REBALANCES = Counter(
    "automq_operator_rebalances", "Evaluations that moved partitions, by trigger", [*LABELS, "trigger"]
)
SCALE_DECISIONS = Counter(
    "automq_operator_scale_decisions", "Broker count changes made by the autoscaler", [*LABELS, "direction"]
)
DESIRED_BROKERS = Gauge("automq_operator_desired_brokers", "Brokers the autoscaler wants", LABELS)
CLUSTER_LOAD = Gauge(
    "automq_operator_cluster_load",
    "Cluster load the autoscaler last saw: bytes_in_mib_per_second (sum), cpu_percent (average per broker)",
    [*LABELS, "metric"],
)
